# Device call (#9): the persistent kernel's O stored by TMA from a K tile (OSTAGE) - its tests (and compute-sanitizer
# memcheck / synccheck on one shape), then a rotated A/B at head_dim 128 against the register stores (tmap%OSTAGE=0),
# tma and cuDNN.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/ostage_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 150 python -m pytest -q -x -p no:cacheprovider tests/test_attention_sm90.py -k "persistent or stream or default or bitwise or determin" 2>&1 | tail -3
for tool in memcheck synccheck; do
  timeout 60 compute-sanitizer --tool $tool python -c "
import sys; sys.path.insert(0, '.')
import cupy as cp, cuflash
for (b, h, sq, sk, causal) in ((2, 4, 1000, 1000, False), (1, 3, 700, 300, True)):
    q, k, v = (cp.random.standard_normal((b, h, n, 128), dtype=cp.float32).astype(cuflash.bfloat16) for n in (sq, sk, sk))
    o = cuflash.attention(q, k, v, causal=causal)
cp.cuda.runtime.deviceSynchronize(); print('ok')" 2>&1 | tail -2
done
timeout 200 python experiments/scratch/fwd_rot_ab.py --head-dims 128 --seqlens 1024 2048 4096 8192 16384 --rounds 6 \
  --vars tmap "tmap%OSTAGE=0" tma --name ostage_rot_ab_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' | cut -c1-330 | tail -11
pack
