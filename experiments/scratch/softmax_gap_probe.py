"""Probe (#3, scratch): the cluster rows at C = 4 / 8 timed back to back (as the sweep) and with the host waiting
after every launch (an idle gap before the next), median and p20-p80 of 30 launches, for the tree on PYTHONPATH
(tag: argv[1]). Question: is the bulk copy's C-dependence (C = 4 -5 %, C = 8 +6 %) in the kernel or in how
launches follow one another (a single profiled launch shows none)?"""
import sys

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

SHAPES = (("float32", 65536), ("float32", 131072), ("bfloat16", 131072), ("bfloat16", 262144))
copy = copy_bandwidth()
for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    for name, each in (("back to back", False), ("idle gap", True)):
        t = bench.time_cuda(lambda: sm.softmax(x, axis=-1), rep=30, sync_each=each)
        f = [frac(rows, cols, dt, t[k], copy) for k in ("median_ms", "p80_ms", "p20_ms")]
        print(sys.argv[1], dname, cols, name, "%.3f (p80-p20 %.3f-%.3f)" % tuple(f), flush=True)
    del x
