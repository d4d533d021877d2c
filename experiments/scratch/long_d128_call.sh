# Device call (#9): head_dim 128 at 4K-16K keys, where "auto" runs tma (pv_n 64): tma against tmap with either
# P V width, now that tmap stores O by TMA; rotated, cuDNN in the same rounds, bfloat16.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/long_d128_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 240 python experiments/scratch/fwd_rot_ab.py --head-dims 128 --seqlens 4096 8192 16384 --causal both --rounds 8 \
  --vars tma tmap@128x128x128 tmap@128x128x64 --name long_d128_rot_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' | cut -c1-420 | tail -7
pack
