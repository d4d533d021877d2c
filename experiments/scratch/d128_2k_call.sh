# Device call (#9): head_dim 128 at 2K-4K: tmap with pv_n 128 (the default) and 64, tma, cuDNN (fwd_rot_ab, rotated,
# bfloat16); then ncu of the default, cuDNN and FLASH at 2K non-causal (fwd_prof.py).
#   CUFLASH_COMMIT=<head> bash experiments/scratch/d128_2k_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 150 python experiments/scratch/fwd_rot_ab.py --head-dims 128 --seqlens 2048 4096 --rounds 8 \
  --vars tmap@128x128x128 tmap@128x128x64 tma@128x128x128 --name d128_2k_rot_${CUFLASH_COMMIT:-x} 2>&1 | tail -5
pack
OUT=$OUT timeout 300 python experiments/scratch/fwd_prof.py 2048 128 0 2>&1 | tail -12
cp $OUT/fwd_prof_*.json experiments/results/logs/ 2>/dev/null
pack
