"""Probe (#3, scratch): the cluster rows at C = 4 / 8 timed back to back (as the sweep), with L2 flushed before
every launch, and with three input sets rotated, for the tree on PYTHONPATH (tag: argv[1])."""
import sys

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

SHAPES = (("float32", 65536), ("float32", 131072), ("bfloat16", 131072), ("bfloat16", 262144))
copy = copy_bandwidth()
for dname, cols, dt, rows, xs in inputs(SHAPES, sets=3):
    f = lambda x: sm.softmax(x, axis=-1)  # noqa: E731
    for name, kw, sets in (("back to back", {}, [(xs[0],)]), ("L2 flushed", {"flush": True}, [(xs[0],)]),
                           ("3 inputs rotated", {}, [(x,) for x in xs])):
        ms = bench.time_cuda(f, *sets, rep=30, **kw)["median_ms"]
        print(sys.argv[1], dname, cols, name, "%.3f" % frac(rows, cols, dt, ms, copy), flush=True)
