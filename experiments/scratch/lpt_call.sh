# Device call (#9): the persistent forward's longest-first groups of heads (LPT_GROUP_BYTES) against one head at
# a time (LPT_GROUP_BYTES = 0, the order before), rotated A/B with cuDNN beside, causal, bfloat16, head_dim 64 and
# 128, 1K-16K; then its tests (tmap, several tiles a block, groups).
#   CUFLASH_COMMIT=<head> bash experiments/scratch/lpt_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 200 python experiments/scratch/fwd_rot_ab.py --causal yes --seqlens 1024 2048 4096 8192 16384 --rounds 6 \
  --vars "auto%LPT_GROUP_BYTES=0" auto --name lpt_rot_ab_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' \
  | cut -c1-330 | tail -11
pack
timeout 150 python -m pytest tests/test_attention_sm90.py -q -x -n 15 -p no:cacheprovider \
  -k "persistent or tmap or group" 2>&1 | tail -2 | cut -c1-300
