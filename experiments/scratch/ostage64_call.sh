# Device call (#9): OSTAGE on the one-consumer tile (Br = 64, head_dim 64, the default below 1024 queries or keys):
# rotated A/B against its register stores (tmap%OSTAGE=0) at 512 (1024, the Br = 192 tile, as a control), then
# the attention and Hopper forward tests.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/ostage64_call.sh   (carry [".kc"])
export PATH=/opt/torch/.venv/bin:$PATH
( . experiments/scratch/_call_env.sh
  timeout 60 python experiments/scratch/fwd_rot_ab.py --head-dims 64 --seqlens 512 1024 --rounds 6 \
    --vars tmap "tmap%OSTAGE=0" --name ostage64_rot_ab_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' | cut -c1-330 | tail -5
  cp experiments/results/ostage64_rot_ab_* $OUT/ 2>/dev/null )
DEADLINE=150 TEST_TIMEOUT=110 bash experiments/gpu_run.sh h200_attn_ostage64 -- -n 15 tests/test_attention_sm90.py \
  tests/test_attention.py tests/test_attention_alt.py > $OUT/run.log 2>&1
grep -n "passed\|failed" $OUT/run.log | head -3
rm -f $OUT/kc.tgz.* $OUT/junit.xml
