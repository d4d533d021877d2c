"""Probe (#3, scratch): softmax against log_softmax (no exponential in its output pass) on the automatic plan at the
cluster rows, float32 and bfloat16, three rounds interleaved, copy in the same run: does the output pass's
exponential (MUFU.EX2) cost the 16-bit rows? Writes experiments/results/softmax_op_probe_<commit>.json.
    PYTHONPATH=. python experiments/scratch/softmax_op_probe.py"""
from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

SHAPES = [("float32", 32768), ("float32", 65536), ("float32", 131072),
          ("bfloat16", 65536), ("bfloat16", 131072), ("bfloat16", 262144), ("bfloat16", 16384)]
out = []
copy = copy_bandwidth()
for rnd in range(3):
    for dname, cols, dt, rows, (x,) in inputs(SHAPES):
        for op, name in ((sm.OP_SOFTMAX, "softmax"), (sm.OP_LOG_SOFTMAX, "log_softmax")):
            fn = lambda o=op: sm._softmax_impl(x, -1, o, "online", None)  # noqa: E731
            _, pl = sm._softmax_impl(x, -1, op, "online", None, return_plan=True)
            ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
            f = frac(rows, cols, dt, ms, copy)
            out.append(dict(round=rnd, dtype=dname, cols=cols, op=name, path=pl.path, C=pl.chunks, copy=pl.copy,
                            ms=ms, frac_of_copy=f))
            print(rnd, dname, cols, name, pl.path, pl.chunks, pl.copy, "%.3f" % f, flush=True)
        del x
bench.write_results(f"softmax_op_probe_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
