#!/usr/bin/env bash
# One device call for the wgmma backward's dQ and lse settings (SM90_DQ_BULK: dQ tiles added by bulk reductions,
# cp.reduce.async.bulk .add.f32, or by float2 atomicAdd; SM90_LSE_ASYNC: lse / Delta by cp.async or by plain
# loads): memcheck on small calls, the test_sm90_dkdv matrix, then the bwd bench, bf16, head_dim 64 / 128,
# 1K / 2K / 4K / 16K, for the four combinations (the first with torch). Kernel cache carried in (carry [".kc"];
# experiments/kcache_offline.py). Results experiments/results/bwd_ab_{bulk,atomic}_{async,sync}.json.
# SKIP_TESTS=1: leave the tests to the full suite (gpu_run.sh) run in the same call.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_ab_call.sh
. experiments/scratch/_call_env.sh
small='import cupy as cp, cuflash, cuflash.attention_bwd as ab
for bulk, la in ((True, False), (False, False), (True, True)):
    ab.SM90_DQ_BULK, ab.SM90_LSE_ASYNC = bulk, la
    for d, n in ((64, 200), (128, 131)):
        q, k, v, do = (cp.random.standard_normal((1, 2, n, d), dtype=cp.float32).astype(cp.float16) for _ in range(4))
        o, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
        print(bulk, d, [float(abs(g.astype(cp.float32)).max()) for g in cuflash.attention_backward(do, q, k, v, o, lse, causal=True)])'
timeout 60 compute-sanitizer --tool memcheck python -c "$small" 2>&1 | tail -5
[ "${SKIP_TESTS:-0}" = 1 ] || CUFLASH_GPU_RECORD=experiments/results/h200_dq_bulk_tests.json timeout 120 python -m pytest -q -p no:xdist \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" --timeout=60 tests/test_attention_bwd.py -k "sm90" 2>&1 | tail -6
pack
export SEQLENS="1024 2048 4096 16384"
T=100 bwd_ab bwd_ab_bulk_async "ab.SM90_DQ_BULK = True; ab.SM90_LSE_ASYNC = True" ""
bwd_ab bwd_ab_atomic_async "ab.SM90_DQ_BULK = False; ab.SM90_LSE_ASYNC = True" "--no-torch"
bwd_ab bwd_ab_bulk_sync "ab.SM90_DQ_BULK = True; ab.SM90_LSE_ASYNC = False" "--no-torch"
bwd_ab bwd_ab_atomic_sync "ab.SM90_DQ_BULK = False; ab.SM90_LSE_ASYNC = False" "--no-torch"
