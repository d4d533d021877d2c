# Device call (#9): bounds for the persistent kernel's work-tile boundary - the epilogue without its O stores
# (NOSTORE, wrong output, study only) and two K/V stages (room for an O staging buffer), head_dim 128, rotated.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/epi_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 200 python experiments/scratch/fwd_rot_ab.py --head-dims 128 --seqlens 1024 2048 4096 --causal both --rounds 6 \
  --vars tmap "tmap%NOSTORE=1" "tmap%XTURN=0" --name epi_rot_ab_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' | cut -c1-400 | tail -4
pack
