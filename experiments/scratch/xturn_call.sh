# Device call (#9): the persistent kernel's ping-pong turns across work tiles (XTURN) - its tests, then a rotated
# A/B at head_dim 128 against the per-tile turns (tmap%XTURN=0), tma and cuDNN.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/xturn_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 150 python -m pytest -q -x -p no:cacheprovider tests/test_attention_sm90.py -k "persistent or stream" 2>&1 | tail -3
timeout 200 python experiments/scratch/fwd_rot_ab.py --head-dims 128 --seqlens 1024 2048 4096 8192 16384 --rounds 6 \
  --vars tmap "tmap%XTURN=0" tma --name xturn_rot_ab_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' | cut -c1-330 | tail -11
pack
