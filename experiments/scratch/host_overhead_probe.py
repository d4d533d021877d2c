"""Probe (scratch): host time per call of the wrappers on a tiny input (the GPU idle most of the time), 2000 calls
and one sync, and a cProfile of the calls of one of them (argument: its name, default layer_norm): norm_slope_probe
found ~100 us a layer_norm call (flat times up to 128 MiB).
    PYTHONPATH=. python experiments/scratch/host_overhead_probe.py [attention]"""
import cProfile
import pstats
import sys
import time

import cupy as cp

import cuflash
from cuflash import _dtypes

x = cp.random.standard_normal((8, 1024), dtype=cp.float32).astype(_dtypes.bfloat16)
w, b = (cp.random.standard_normal(1024, dtype=cp.float32).astype(_dtypes.bfloat16) for _ in range(2))
calls = {"layer_norm": lambda: cuflash.layer_norm(x, (1024,), w, b), "rms_norm": lambda: cuflash.rms_norm(x, (1024,), w),
         "layer_norm no affine": lambda: cuflash.layer_norm(x, (1024,)),
         "softmax": lambda: cuflash.softmax(x, axis=-1), "cupy x + x": lambda: x + x}
q, k, v = (cp.random.standard_normal((1, 4, 128, 64), dtype=cp.float32).astype(_dtypes.bfloat16) for _ in range(3))
calls["attention causal (1, 4, 128, 64)"] = lambda: cuflash.attention(q, k, v, causal=True)
calls["attention"] = calls["attention causal (1, 4, 128, 64)"]
calls["attention_backward"] = lambda: cuflash.attention_backward(do, q, k, v, o, lse, causal=True)
o, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
do = cp.random.standard_normal(o.shape, dtype=cp.float32).astype(_dtypes.bfloat16)
target = (sys.argv[1:] or ["layer_norm"])[0]
for name, fn in calls.items():
    if name in ("attention",):
        continue
    for _ in range(20):
        fn()
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(2000):
        fn()
    cp.cuda.Device().synchronize()
    print("%-22s %.1f us a call" % (name, (time.perf_counter() - t) / 2000 * 1e6), flush=True)
pr = cProfile.Profile()
pr.enable()
for _ in range(2000):
    calls[target]()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
