"""Probe (#3, scratch): the cluster rows at C = 2 / 4 / 8 launched one cluster a row (the default) and as
persistent clusters (as many as are resident: 3 blocks an SM), for the source tree on PYTHONPATH; prints the
fraction of copy per (dtype, cols, launch). Run it once per tree, interleaved:
    PYTHONPATH=abm python experiments/scratch/softmax_persist_probe.py tree_1; PYTHONPATH=. ... here_1"""
import json
import sys

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

tag = sys.argv[1]
SHAPES = (("float32", 32768), ("float32", 65536), ("float32", 131072), ("bfloat16", 65536),
          ("bfloat16", 131072), ("bfloat16", 262144))
copy = copy_bandwidth()
out = []
for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    c = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None).plan.chunks
    for name, part in (("one cluster a row", None), ("persistent", {"path": "cluster", "cluster": c,
                                                                    "clusters": 3 * 132 // c})):
        ms = bench.time_cuda(lambda p=part: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p), rep=30)["median_ms"]
        f = frac(rows, cols, dt, ms, copy)
        out.append(dict(tag=tag, dtype=dname, cols=cols, C=c, launch=name, ms=ms, frac_of_copy=f))
        print(tag, dname, cols, "C=%d" % c, name, "%.3f" % f, flush=True)
    del x
json.dump(out, open(f"experiments/results/softmax_persist_probe_{tag}.json", "w"), indent=1)
