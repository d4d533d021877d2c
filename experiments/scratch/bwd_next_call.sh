#!/usr/bin/env bash
# One device call for the wgmma backward's study settings (wip/fwd-pin carries them; none is the default):
# head_dim 64 dQ split over both warpgroups (always on in this branch), SM90_STAGES = 2 (two Q/dO/lse/Delta
# buffers), SM90_OVERLAP (P^T while dP^T's wgmma runs, dS^T while dV's does). memcheck on small calls, the
# test_sm90_dkdv matrix (one process), then the bwd bench, bf16, head_dim 64 / 128, 1K and 16K, at
# (stages, overlap) = (1, off) with torch, (2, off), (1, on), (2, on). Limits add to 580 s (the bench with torch
# 80 s, the others 70 s); results packed per step.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_next_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pack() { tar czf "$OUT/r.tgz" experiments/results; }
small='import cupy as cp, cuflash, cuflash.attention_bwd as ab
for st, ov in ((1, False), (2, True)):
    ab.SM90_STAGES, ab.SM90_OVERLAP = st, ov
    for d in (64, 128):
        q, k, v, do = (cp.random.standard_normal((1, 2, 200, d), dtype=cp.float32).astype(cp.float16) for _ in range(4))
        o, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
        print(st, ov, d, [float(abs(g.astype(cp.float32)).max()) for g in cuflash.attention_backward(do, q, k, v, o, lse, causal=True)])'
timeout 90 compute-sanitizer --tool memcheck python -c "$small" 2>&1 | tail -5
CUFLASH_GPU_RECORD=experiments/results/h200_bwd_next_tests.json timeout 200 python -m pytest -q -p no:xdist \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" --timeout=90 tests/test_attention_bwd.py -k "sm90_dkdv or sm90_study" 2>&1 | tail -8
pack
bb() {  # name, statement on cuflash.attention_bwd (module ab), extra bench arguments
  timeout ${T:-70} python -c "import runpy, sys; sys.path.insert(0, '.'); import cuflash.attention_bwd as ab; $2
sys.argv = ['attention_bwd_bench.py', '--dtypes', 'bfloat16', '--seqlens', '1024', '16384', '--rep', '20',
            '--warmup', '3', '--name', '$1'] + '$3'.split()
runpy.run_path('experiments/attention_bwd_bench.py', run_name='__main__')" 2>&1 | grep -v "cfg/s" | tail -12
  pack
}
T=80 bb attention_bwd_bench_st1 "ab.SM90_STAGES, ab.SM90_OVERLAP = 1, False" ""
bb attention_bwd_bench_st2 "ab.SM90_STAGES, ab.SM90_OVERLAP = 2, False" "--no-torch"
bb attention_bwd_bench_ovl1 "ab.SM90_STAGES, ab.SM90_OVERLAP = 1, True" "--no-torch"
bb attention_bwd_bench_ovl2 "ab.SM90_STAGES, ab.SM90_OVERLAP = 2, True" "--no-torch"
