#!/usr/bin/env bash
# One device call for wip/fwd-pin (on wip/bwd-sm90-stages, on wip/bwd-d64-dq): (1) the forward's PIN_SOFTMAX
# (CUFLASH_FWD_PIN: the softmax kept between the two wgmma waits; ptxas 13.0 moved the P V wait above it) — the
# device NVRTC's SASS order, its bitwise-equality test and an A/B with cuDNN; (2) the wgmma backward's head_dim 64
# dQ split and SM90_STAGES = 2 — memcheck, test_sm90_dkdv, the bwd bench at stages 1 / 2. Limits add to 560 s;
# each step's results are packed as soon as it ends.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/next13_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pack() { tar czf "$OUT/r.tgz" experiments/results; }
timeout 60 python experiments/scratch/sass_order.py 2>&1 | tail -9
small='import cupy as cp, cuflash, cuflash.attention_bwd as ab, cuflash._attention_sm90 as S
for st in (1, 2):
    ab.SM90_STAGES = st
    S.PIN_SOFTMAX = st == 2
    for d in (64, 128):
        q, k, v, do = (cp.random.standard_normal((1, 2, 200, d), dtype=cp.float32).astype(cp.float16) for _ in range(4))
        o, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
        print(st, d, [float(abs(g.astype(cp.float32)).max()) for g in cuflash.attention_backward(do, q, k, v, o, lse, causal=True)])'
timeout 100 compute-sanitizer --tool memcheck python -c "$small" 2>&1 | tail -5
CUFLASH_GPU_RECORD=experiments/results/h200_next13_tests.json timeout 170 python -m pytest -q -p no:xdist \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" --timeout=90 tests/test_attention_bwd.py \
  tests/test_attention_sm90.py -k "sm90_dkdv or pin_softmax" 2>&1 | tail -8
pack
timeout 70 python experiments/scratch/fwd_pin_ab.py --rep 20 2>&1 | tail -20
pack
bb() {  # name, statement on cuflash.attention_bwd (module ab), extra bench arguments
  timeout 80 python -c "import runpy, sys; sys.path.insert(0, '.'); import cuflash.attention_bwd as ab; $2
sys.argv = ['attention_bwd_bench.py', '--dtypes', 'bfloat16', '--seqlens', '1024', '16384', '--rep', '20',
            '--warmup', '3', '--name', '$1'] + '$3'.split()
runpy.run_path('experiments/attention_bwd_bench.py', run_name='__main__')" 2>&1 | grep -v "cfg/s" | tail -12
  pack
}
bb attention_bwd_bench_st1 "ab.SM90_STAGES = 1" ""
bb attention_bwd_bench_st2 "ab.SM90_STAGES = 2" "--no-torch"
