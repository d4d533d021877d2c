"""Probe (#3, scratch): the cluster rows at C = 4 / 8 timed back to back (as the sweep), with L2 flushed before
every launch, and with three input sets rotated, for the tree on PYTHONPATH (tag: argv[1])."""
import importlib
import sys

sys.path.insert(1, "experiments")
import softmax_sweep as sw  # noqa: E402
from cuflash import _dtypes, bench  # noqa: E402

sm = importlib.import_module("cuflash.softmax")
copy = sw.copy_bandwidth(256 << 20, 30)
for dname, cols in (("float32", 65536), ("float32", 131072), ("bfloat16", 131072), ("bfloat16", 262144)):
    dt = getattr(_dtypes, dname)
    rows = (256 << 20) // (cols * dt.itemsize)
    xs = [sw._inputs(rows, cols, dname, None)[0] for _ in range(3)]
    useful = 2 * rows * cols * dt.itemsize
    f = lambda x: sm.softmax(x, axis=-1)  # noqa: E731
    for name, kw, sets in (("back to back", {}, [(xs[0],)]), ("L2 flushed", {"flush": True}, [(xs[0],)]),
                           ("3 inputs rotated", {}, [(x,) for x in xs])):
        ms = bench.time_cuda(f, *sets, rep=30, **kw)["median_ms"]
        print(sys.argv[1], dname, cols, name, "%.3f" % (useful / (ms * 1e-3) / 1e9 / copy), flush=True)
    del xs
