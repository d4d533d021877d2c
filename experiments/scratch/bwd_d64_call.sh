#!/usr/bin/env bash
# One device call for wip/bwd-d64-dq (the wgmma backward at head_dim 64 splits dQ over both warpgroups, 32 columns
# each, m64n32 wgmma with a 64-byte offset into the swizzled K rows; at a4f9923 warpgroup 0 computed all 64):
# memcheck on one small call, test_sm90_dkdv (one process: the module precompiles the backward kernels), then
# the backward benchmark at head_dim 64 (bfloat16, 1K / 4K / 16K) to set beside attention_bwd_bench.json's a4f9923
# head_dim 64 rows (the same run's mma.sync columns and FLASH are the yardstick).
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_d64_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
small='import cupy as cp, cuflash
q, k, v, do = (cp.random.standard_normal((1, 2, 200, 64), dtype=cp.float32).astype(cp.float16) for _ in range(4))
o, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
print([float(abs(g.astype(cp.float32)).max()) for g in cuflash.attention_backward(do, q, k, v, o, lse, causal=True)])'
timeout 120 compute-sanitizer --tool memcheck python -c "$small" 2>&1 | tail -2
CUFLASH_GPU_RECORD=experiments/results/h200_bwd_d64_tests.json timeout 200 python -m pytest -q -p no:xdist \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" --timeout=60 tests/test_attention_bwd.py -k "sm90_dkdv" 2>&1 | tail -6
tar czf "$OUT/r.tgz" experiments/results
timeout 150 python experiments/attention_bwd_bench.py --head-dims 64 --dtypes bfloat16 --seqlens 1024 4096 16384 \
  --rep 20 --warmup 3 --name attention_bwd_bench_d64 2>&1 | grep -v "cfg/s" | tail -12
tar czf "$OUT/r.tgz" experiments/results
