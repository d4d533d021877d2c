"""Probe (#4, scratch): the norms' steady-state rate against their fixed cost per launch, as softmax_slope_probe.py
for softmax: layer_norm (weight and bias) and rms_norm (weight) forward at 64, 128, 256 and 512 MiB of input per
shape (tokens scale, hidden fixed), with the device copy, two rounds; slope and intercept of time against bytes.
    PYTHONPATH=. python experiments/scratch/norm_slope_probe.py"""
import cupy as cp
from _slope import MIBS, copy_rows, fit_report

import cuflash
from cuflash import _dtypes, bench

SHAPES = [("bfloat16", 1024), ("bfloat16", 8192), ("bfloat16", 16384), ("bfloat16", 32768), ("float32", 1024),
          ("float32", 16384), ("float32", 32768)]
out = []
for rnd in range(2):
    out += copy_rows(rnd, "hidden", touch=True)
    for dname, n in SHAPES:
        dt = getattr(_dtypes, dname)
        w, b = (cp.random.standard_normal(n, dtype=cp.float32).astype(dt) for _ in range(2))
        for mib in MIBS:
            rows = (mib << 20) // (n * dt.itemsize)
            x = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dt)
            for op, fn in (("layer_norm", lambda: cuflash.layer_norm(x, (n,), w, b)),
                           ("rms_norm", lambda: cuflash.rms_norm(x, (n,), w))):
                ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
                out.append(dict(round=rnd, impl=op, dtype=dname, hidden=n, mib=mib, ms=ms))
            del x
fit_report(out, "hidden", "norm_slope_probe")
