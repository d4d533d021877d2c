"""Probe (#3, scratch): softmax against log_softmax (no exponential in its output pass) on the automatic plan at the
cluster rows, float32 and bfloat16, three rounds interleaved, copy in the same run: does the output pass's
exponential (MUFU.EX2) cost the 16-bit rows? Writes experiments/results/softmax_op_probe_<commit>.json.
    PYTHONPATH=. python experiments/scratch/softmax_op_probe.py"""
import importlib
import sys

sys.path.insert(0, "experiments")
import softmax_sweep as sw  # noqa: E402
from cuflash import _dtypes, bench  # noqa: E402

sm = importlib.import_module("cuflash.softmax")
SHAPES = [("float32", 32768), ("float32", 65536), ("float32", 131072),
          ("bfloat16", 65536), ("bfloat16", 131072), ("bfloat16", 262144), ("bfloat16", 16384)]
nbytes = 256 << 20
out = []
copy = sw.copy_bandwidth(nbytes, 30)
for rnd in range(3):
    for dname, cols in SHAPES:
        dt = getattr(_dtypes, dname)
        rows = nbytes // (cols * dt.itemsize)
        x, _ = sw._inputs(rows, cols, dname, None)
        for op, name in ((sm.OP_SOFTMAX, "softmax"), (sm.OP_LOG_SOFTMAX, "log_softmax")):
            fn = lambda o=op: sm._softmax_impl(x, -1, o, "online", None)  # noqa: E731
            _, pl = sm._softmax_impl(x, -1, op, "online", None, return_plan=True)
            ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
            frac = 2 * rows * cols * dt.itemsize / (ms * 1e-3) / 1e9 / copy
            out.append(dict(round=rnd, dtype=dname, cols=cols, op=name, path=pl.path, C=pl.chunks, copy=pl.copy,
                            ms=ms, frac_of_copy=frac))
            print(rnd, dname, cols, name, pl.path, pl.chunks, pl.copy, "%.3f" % frac, flush=True)
        del x
bench.write_results(f"softmax_op_probe_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
