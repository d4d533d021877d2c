#!/usr/bin/env bash
# One device call for wip/bwd-wgmma (SM90_DKDV: the wgmma dK/dV kernel, head_dim 128): compute-sanitizer memcheck
# and racecheck on one small call, its GPU test (test_sm90_dkdv) and the backward's other tests with it forced on
# where they reach head_dim 128, then the backward benchmark (--quick: head_dim 128, seqlen 1K / 4K, bfloat16)
# with it (attention_bwd_bench_sm90) and without (attention_bwd_bench_base), torch left out of the second.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_sm90_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
small='import cupy as cp, cuflash, cuflash.attention_bwd as ab; ab.SM90_DKDV = True
q, k, v, do = (cp.random.standard_normal((1, 2, 200, 128), dtype=cp.float32).astype(cp.float16) for _ in range(4))
o, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
print([float(abs(g.astype(cp.float32)).max()) for g in cuflash.attention_backward(do, q, k, v, o, lse, causal=True)])'
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool python -c "$small" 2>&1 | tail -2
done
CUFLASH_GPU_RECORD=experiments/results/h200_bwd_sm90_tests.json timeout 200 python -m pytest -q -n 8 -p no:cacheprovider \
  -o addopts="-ra --benchmark-disable" tests/test_attention_bwd.py -k "sm90" 2>&1 | tail -15
tar czf "$OUT/r.tgz" experiments/results
ab() {  # name, statement on cuflash.attention_bwd (module ab), bench arguments
  timeout 150 python -c "import runpy, sys; sys.path.insert(0, '.'); import cuflash.attention_bwd as ab; $2
sys.argv = ['attention_bwd_bench.py', '--quick', '--name', '$1'] + '$3'.split()
runpy.run_path('experiments/attention_bwd_bench.py', run_name='__main__')" 2>&1 | grep -v "it/s" | tail -12
}
ab attention_bwd_bench_sm90 "ab.SM90_DKDV = True" ""
ab attention_bwd_bench_base "pass" "--no-torch"
tar czf "$OUT/r.tgz" experiments/results plots
