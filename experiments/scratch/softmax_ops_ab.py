"""Probe (#3, scratch): softmax and log_softmax on the automatic plan, float32 and bfloat16, 1K-256K columns at
256 MiB, copy in the same process; one round per process (run it in two trees, interleaved, for a same-run A/B).
    PYTHONPATH=. python experiments/scratch/softmax_ops_ab.py NAME   -> experiments/results/NAME.json"""
import sys

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

SHAPES = [("float32", 1 << k) for k in range(10, 18)] + [("bfloat16", 1 << k) for k in range(10, 19)]
out = []
copy = copy_bandwidth()
for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    for op, name in ((sm.OP_SOFTMAX, "softmax"), (sm.OP_LOG_SOFTMAX, "log_softmax")):
        fn = lambda o=op: sm._softmax_impl(x, -1, o, "online", None)  # noqa: E731
        _, pl = sm._softmax_impl(x, -1, op, "online", None, return_plan=True)
        ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
        out.append(dict(dtype=dname, cols=cols, op=name, path=pl.path, C=pl.chunks, ms=ms,
                        frac_of_copy=frac(rows, cols, dt, ms, copy)))
    del x
bench.write_results(sys.argv[1], out, {"copy_GBps": copy})
