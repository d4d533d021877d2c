"""Probe (#3, scratch): steady-state rate against fixed cost per launch. Times softmax (automatic plan) and the
device-to-device copy at 64, 128, 256 and 512 MiB of input for each shape (rows scale, cols fixed), three rounds;
the slope between the sizes is the steady-state rate, the intercept the fixed cost of one launch (ramp-up and
tail). If cuflash's slope is near copy's and its intercept larger, the gap to copy at 256 MiB is the launch's ends,
not its stream. Writes experiments/results/softmax_slope_probe_<commit>.json.
    PYTHONPATH=. python experiments/scratch/softmax_slope_probe.py"""
from _slope import MIBS, copy_rows, fit_report
from _softmax_probe import bench, sm, sw
from cuflash import _dtypes

SHAPES = [("bfloat16", 16384), ("bfloat16", 32768), ("float32", 32768), ("bfloat16", 65536), ("float32", 65536),
          ("float32", 131072), ("bfloat16", 131072)]
out = []
for rnd in range(2):
    out += copy_rows(rnd, "cols")
    for dname, cols in SHAPES:
        dt = getattr(_dtypes, dname)
        for mib in MIBS:
            rows = (mib << 20) // (cols * dt.itemsize)
            x, _ = sw._inputs(rows, cols, dname, None)
            _, pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
            ms = bench.time_cuda(lambda: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None), warmup=3,
                                 rep=30)["median_ms"]
            out.append(dict(round=rnd, impl="cuflash", dtype=dname, cols=cols, mib=mib, rows=rows, ms=ms,
                            path=pl.path, C=pl.chunks, threads=pl.threads))
            del x
fit_report(out, "cols", "softmax_slope_probe")
