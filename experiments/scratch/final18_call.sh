#!/usr/bin/env bash
# One device call after b49b37b landed (#9): compute-sanitizer memcheck on small calls of every attention kernel the
# per-row mask bounds touched (the Hopper forward's default tiles at head_dim 64 / 128 and Br = 192, the FA-2
# forward, the wgmma and mma.sync backwards with their preprocess and dQ convert), after a same-run A/B of the
# default tile against Br = 192, Bc = 64 at head_dim 64 (bfloat16, cuDNN beside it): does the 192 tile now win
# below LONG_SEQLEN_K or on causal rows? Carry [".kc"];  CUFLASH_COMMIT=<hash> bash experiments/scratch/final18_call.sh
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
timeout 200 python experiments/scratch/fwd_variant_ab.py --a tma --b tma --b-blocks 192 64 --head-dims 64 \
  --seqlens 1024 2048 4096 8192 16384 --rep 20 --dtype bfloat16 --name fwd_br192_ab_${CUFLASH_COMMIT:-here} 2>&1 | tail -13
pack; el ab
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 python -c "
import numpy as np, cupy as cp, cuflash
from cuflash import _dtypes
rng = np.random.default_rng(1)
shapes = [(1, 1, False, (-1, -1), 1, 1), (193, 517, True, (-1, -1), 4, 2), (700, 130, False, (0, 0), 2, 2),
          (385, 1000, False, (77, 13), 2, 1), (130, 130, True, (-1, -1), 1, 1)]
n = 0
for dt in (np.float16, _dtypes.bfloat16):
    for d in (64, 128):
        for sq, sk, causal, win, hq, hkv in shapes:
            q, k, v, do = (cp.asarray(rng.standard_normal(s, dtype=np.float32)).astype(dt)
                           for s in ((1, hq, sq, d), (1, hkv, sk, d), (1, hkv, sk, d), (1, hq, sq, d)))
            kw = dict(causal=causal, window_size=win)
            for sched, bs in (('auto', None), ('fa2', None)) + ((('wgmma', (192, 64)),) if d == 64 else ()):
                o, lse = cuflash.attention(q, k, v, schedule=sched, block_sizes=bs, return_lse=True, **kw); n += 1
            cuflash.attention_backward(do, q, k, v, o, lse, **kw); n += 1
            cuflash.attention_backward(do, q, k, v, o, lse, block_sizes=(64, 128), **kw); n += 1
cp.cuda.runtime.deviceSynchronize(); print('memcheck:', n, 'calls done')" 2>&1 | tail -4
echo "memcheck rc=${PIPESTATUS[0]}"; el memcheck
pack
