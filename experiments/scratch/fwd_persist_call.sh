#!/usr/bin/env bash
# One device call for the persistent Hopper forward 'tmap' (wip/fwd-persist64: wip/sm90-persistent on today's
# kernel, pinned, with a Br = 64 tile at head_dim 64 and two blocks per SM): memcheck on small calls, the sm90
# tests of 'tmap', then the A/B tma vs tmap with cuDNN (bf16, 512-16K, causal and not). ~4 min with the kernel
# cache carried (carry [".kc"]; experiments/kcache_offline.py --match attention).
# SKIP_TESTS=1: leave the tests to the full suite (gpu_run.sh) run in the same call.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_persist_call.sh
. experiments/scratch/_call_env.sh
small='import cupy as cp, cuflash, cuflash._attention_sm90 as S
S.DEFAULT_VARIANT = "tmap"
for d, n in ((64, 700), (64, 3000), (128, 700)):
    q, k, v = (cp.random.standard_normal((2, 3, n, d), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    print(d, n, float(abs(cuflash.attention(q, k, v, causal=True).astype(cp.float32)).max()))'
timeout 90 compute-sanitizer --tool memcheck python -c "$small" 2>&1 | tail -4
[ "${SKIP_TESTS:-0}" = 1 ] || CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_fwd_persist_tests.json timeout 200 python -m pytest -q -n 8 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" --timeout=120 tests/test_attention_sm90.py -k "tmap or persistent" 2>&1 | tail -6
pack
timeout 200 python experiments/scratch/fwd_variant_ab.py --a tma --b tmap --rep 20 2>&1 | tail -24
pack
