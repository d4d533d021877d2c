"""Probe (#3, scratch): the cluster rows at C = 4 / 8 timed back to back (as the sweep) and with the host waiting
after every launch (an idle gap before the next), median and p20-p80 of 30 launches, for the tree on PYTHONPATH
(tag: argv[1]). Question: is the bulk copy's C-dependence (C = 4 -5 %, C = 8 +6 %) in the kernel or in how
launches follow one another (a single profiled launch shows none)?"""
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
    x = sw._inputs(rows, cols, dname, None)[0]
    useful = 2 * rows * cols * dt.itemsize
    for name, each in (("back to back", False), ("idle gap", True)):
        t = bench.time_cuda(lambda: sm.softmax(x, axis=-1), rep=30, sync_each=each)
        f = [useful / (t[k] * 1e-3) / 1e9 / copy for k in ("median_ms", "p80_ms", "p20_ms")]
        print(sys.argv[1], dname, cols, name, "%.3f (p80-p20 %.3f-%.3f)" % tuple(f), flush=True)
    del x
