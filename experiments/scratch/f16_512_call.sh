# Device call (#9): the attention bench's float16 head_dim 128 512 causal row (0.63x cuDNN at e65aa5d, bfloat16 0.87x)
# re-timed, rotated, both dtypes, tmap / tma / cuDNN, with the host time of a call.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/f16_512_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
for dt in float16 bfloat16; do
  timeout 100 python experiments/scratch/fwd_rot_ab.py --head-dims 128 --seqlens 512 1024 --causal both --rounds 8 \
    --dtype $dt --vars tmap tma --name f16_512_rot_${dt}_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' | cut -c1-300 | tail -4
done
pack
