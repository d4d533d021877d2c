# Device call (#9): rotated A/B (fwd_rot_ab: tma, tmap, cuDNN in turn, 6 rounds) with nvidia-smi dmon beside it
# (SM clock, power, temperature each second), bfloat16 1K-16K both head_dims; then float16 2K-8K.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/tmap_rot_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
(nvidia-smi dmon -s pc -d 1 > experiments/results/dmon_rot_${CUFLASH_COMMIT:-x}.txt 2>&1 &)
timeout 200 python experiments/scratch/fwd_rot_ab.py --name tmap_rot_ab_bfloat16_${CUFLASH_COMMIT:-x} 2>&1 | tail -22
pack
timeout 100 python experiments/scratch/fwd_rot_ab.py --dtype float16 --seqlens 2048 4096 8192 \
  --name tmap_rot_ab_float16_${CUFLASH_COMMIT:-x} 2>&1 | tail -14
pkill -f "nvidia-smi dmon" || true
pack
