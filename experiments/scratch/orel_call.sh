# Device call (#9, OREL_LATE, branch wip/orel): the full GPU suite with the attention bench (the record), then
# compute-sanitizer synccheck / memcheck on all five persistent tiles (qsplit_call.sh does both), then the rotated
# A/B of the three places to release the previous work tile's O stage (OREL_LATE 1, 0, 2), both dtypes.
#   python experiments/scratch/orel_build.py /tmp/kc && pack /tmp/kc into .kc/kc.tgz.* (gpu_run.sh's header)
#   CUFLASH_COMMIT=<head> bash experiments/scratch/orel_call.sh   (carry [".kc"]; ~360 s of device time)
# As run at 344a9e4 (the record); after 7d208f4 (OREL_LATE = 2 dropped) leave "tmap%OREL_LATE=2" out.
bash experiments/scratch/qsplit_call.sh
export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=. CUPY_CACHE_DIR=$PWD/.kcache
for dt in bfloat16 float16; do
  timeout 80 python experiments/scratch/fwd_rot_ab.py --name orel_rot_ab_${dt}_${CUFLASH_COMMIT:-x} --vars tmap \
    "tmap%OREL_LATE=0" "tmap%OREL_LATE=2" --seqlens 1024 2048 4096 --head-dims 128 --rounds 8 --rep 10 --dtype $dt 2>&1 \
    | grep head_dim | sed 's/tflops_//g; s/ | ms_[^|]*//g' | cut -c1-300
done
cp experiments/results/orel_rot_ab_*.json "$OUT"/ 2>/dev/null; true
