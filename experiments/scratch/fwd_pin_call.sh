#!/usr/bin/env bash
# One device call for the Hopper forward's PIN_SOFTMAX (CUFLASH_FWD_PIN, study): the SASS order from the device's
# NVRTC, memcheck on a small pinned call, the pin test (bitwise equal to the default, reference check; the sm90
# canaries run first), then the A/B with cuDNN (bf16, head_dim 64 / 128, 512-16K, causal and not). ~5 min.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_pin_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pack() { tar czf "$OUT/r.tgz" experiments/results; }
timeout 90 python experiments/scratch/sass_order.py 2>&1 | tail -9
small='import cupy as cp, cuflash, cuflash._attention_sm90 as S
S.PIN_SOFTMAX = True
for d in (64, 128):
    q, k, v = (cp.random.standard_normal((1, 2, 700, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    print(d, float(abs(cuflash.attention(q, k, v, causal=True).astype(cp.float32)).max()))'
timeout 90 compute-sanitizer --tool memcheck python -c "$small" 2>&1 | tail -3
CUFLASH_GPU_RECORD=experiments/results/h200_fwd_pin_tests.json timeout 200 python -m pytest -q -p no:xdist \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" --timeout=120 tests/test_attention_sm90.py -k "pin_softmax" 2>&1 | tail -8
pack
timeout 150 python experiments/scratch/fwd_pin_ab.py --rep 20 2>&1 | tail -20
pack
