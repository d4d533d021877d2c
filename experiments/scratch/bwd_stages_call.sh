#!/usr/bin/env bash
# One device call for wip/bwd-sm90-stages (on wip/bwd-d64-dq): the wgmma backward (1) at head_dim 64 splitting dQ
# over both warpgroups (m64n32 each, the B operand 64 bytes into the swizzled K rows), (2) with two Q/dO/lse/Delta
# buffers (SM90_STAGES = 2, study setting): memcheck on small calls (64 and 128, both settings), test_sm90_dkdv
# (one process, per-test limit 90 s; limits add up to 540 s), then the backward benchmark, bfloat16, head_dim 64 and 128, 1K / 4K / 16K,
# with SM90_STAGES 1 (torch peers) and 2 (without), to set beside attention_bwd_bench.json (a4f9923: head_dim 64
# with warpgroup 0 alone computing dQ).
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_stages_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
small='import cupy as cp, cuflash, cuflash.attention_bwd as ab, sys
ab.SM90_STAGES = int(sys.argv[1])
for d in (64, 128):
    q, k, v, do = (cp.random.standard_normal((1, 2, 200, d), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    o, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
    print(d, [float(abs(g.astype(cp.float32)).max()) for g in cuflash.attention_backward(do, q, k, v, o, lse, causal=True)])'
for st in 1 2; do timeout 70 compute-sanitizer --tool memcheck python -c "$small" $st 2>&1 | tail -3; done
CUFLASH_GPU_RECORD=experiments/results/h200_bwd_stages_tests.json timeout 180 python -m pytest -q -p no:xdist \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" --timeout=90 tests/test_attention_bwd.py -k "sm90_dkdv" 2>&1 | tail -8
tar czf "$OUT/r.tgz" experiments/results
bb() {  # name, statement on cuflash.attention_bwd (module ab), extra bench arguments
  timeout 110 python -c "import runpy, sys; sys.path.insert(0, '.'); import cuflash.attention_bwd as ab; $2
sys.argv = ['attention_bwd_bench.py', '--dtypes', 'bfloat16', '--seqlens', '1024', '4096', '16384', '--rep', '20',
            '--warmup', '3', '--name', '$1'] + '$3'.split()
runpy.run_path('experiments/attention_bwd_bench.py', run_name='__main__')" 2>&1 | grep -v "cfg/s" | tail -18
  tar czf "$OUT/r.tgz" experiments/results
}
bb attention_bwd_bench_st1 "ab.SM90_STAGES = 1" ""
bb attention_bwd_bench_st2 "ab.SM90_STAGES = 2" "--no-torch"
