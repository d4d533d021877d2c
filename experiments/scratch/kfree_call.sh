# Device call (#9, review mend): the attention and Hopper forward tests, compute-sanitizer synccheck / memcheck on
# persistent launches whose work tiles see one K/V tile each (the case of the alternating K-tile-free barriers),
# then the attention bench.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/kfree_call.sh   (carry [".kc"])
export PATH=/opt/torch/.venv/bin:$PATH
DEADLINE=300 TEST_TIMEOUT=200 BENCH_TIMEOUT=100 BENCH="python experiments/attention_bench.py --rep 20 --name attention_bench_${CUFLASH_COMMIT:-x} 2>&1 | tail -2" \
  bash experiments/gpu_run.sh h200_attn_kfree -- -n 15 tests/test_attention_sm90.py tests/test_attention.py tests/test_attention_alt.py > $OUT/run.log 2>&1
grep -n "passed\|failed\|rc=" $OUT/run.log | head -4
export PYTHONPATH=. CUPY_CACHE_DIR=$PWD/.kcache
for tool in synccheck memcheck; do
  timeout 90 compute-sanitizer --tool $tool python -c "
import cupy as cp, cuflash
for (b, h, sq, sk, causal, win) in ((8, 16, 512, 100, True, (-1, -1)), (4, 16, 700, 300, False, (60, 0)), (2, 8, 1000, 1000, True, (-1, -1))):
    q = cp.random.standard_normal((b, h, sq, 128), dtype=cp.float32).astype(cuflash.bfloat16)
    k, v = (cp.random.standard_normal((b, h, sk, 128), dtype=cp.float32).astype(cuflash.bfloat16) for _ in range(2))
    o = cuflash.attention(q, k, v, causal=causal, window_size=win)
cp.cuda.runtime.deviceSynchronize(); print('ok')" 2>&1 | tail -2
done
rm -f $OUT/kc.tgz.* $OUT/junit.xml
