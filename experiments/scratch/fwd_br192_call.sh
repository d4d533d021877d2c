#!/usr/bin/env bash
# One device call for wip/fwd-br192 (#9 at head_dim 64: the Br = 192, Bc = 64 tile of the 'tma' variant), with the
# #4 probe. Usage, from the repo root on the device (carry [".kc"]):
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_br192_call.sh
# 1. the tile's tests (every default-variant tile on every tail shape and mask, every configuration, the TMA
#    fallback and the bad-input tests), recorded in experiments/results/h200_br192_tests.json;
# 2. compute-sanitizer memcheck on small Br = 192 calls (tails, causal, window, GQA);
# 3. A/B: the default tile against (192, 64), interleaved, cuDNN in the same run (head_dim 64, both dtypes);
# 4. ncu of cuflash (default and 192x64) against cuDNN and FLASH at 2K causal;
# 5. ln_affine_probe.py (#4).
# Everything lands in experiments/results (+ $OUT/fwd_prof_*.json); packed into $OUT/r.tgz after each step.
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_GPU_RECORD=experiments/results/h200_br192_tests.json timeout 200 python -m pytest -q -n 15 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_attention_sm90.py tests/test_attention.py \
  -k "every_default_variant_tile or every_configuration or tma_fallback or bad_inputs_raise" 2>&1 | tail -4
pack; el tests
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python -c "
import numpy as np, cupy as cp, cuflash
from cuflash import _dtypes
rng = np.random.default_rng(1)
for dt in (np.float16, _dtypes.bfloat16):
    for sq, sk, causal, win, hq, hkv in [(1, 1, False, (-1, -1), 1, 1), (193, 517, True, (-1, -1), 4, 2),
                                         (700, 130, False, (0, 0), 2, 2), (385, 1000, False, (77, 13), 2, 1),
                                         (64, 0, False, (-1, -1), 1, 1)]:
        q, k, v = (cp.asarray(rng.standard_normal(s, dtype=np.float32)).astype(dt)
                   for s in ((1, hq, sq, 64), (1, hkv, sk, 64), (1, hkv, sk, 64)))
        cuflash.attention(q, k, v, causal=causal, window_size=win, schedule='wgmma', block_sizes=(192, 64))
cp.cuda.runtime.deviceSynchronize(); print('memcheck calls done')" 2>&1 | tail -3
el memcheck
for dt in bfloat16 float16; do
  timeout 150 python experiments/scratch/fwd_variant_ab.py --a tma --b tma --b-blocks 192 64 --head-dims 64 \
    --seqlens 512 1024 2048 4096 8192 16384 --rep 20 --dtype $dt --name fwd_br192_ab_$dt 2>&1 | tail -15
  pack; el "ab $dt"
done
FWD_PROF_BLOCKS=192,64 timeout 150 python experiments/scratch/fwd_prof.py 2048 64 1 2>&1 | tail -12
el prof
timeout 90 python experiments/scratch/ln_affine_probe.py 2>&1 | tail -12
pack; el ln
