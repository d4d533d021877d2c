"""Probe (#3, scratch): every cluster size C at the cluster rows of 128-512 KiB (float32 32K-128K, bfloat16 64K-256K
columns), the planner's own choice beside them, copy in the same run; three rounds interleaved. Prints the fraction
of copy per (dtype, cols, C) and writes experiments/results/softmax_csize_probe_<commit>.json.
    PYTHONPATH=. python experiments/scratch/softmax_csize_probe.py"""
from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

from cuflash import reference

SHAPES = [("float32", 32768), ("float32", 65536), ("float32", 131072),
          ("bfloat16", 65536), ("bfloat16", 131072), ("bfloat16", 262144)]
rows_out = []
copy = copy_bandwidth()
for rnd in range(3):
    for dname, cols, dt, rows, (x,) in inputs(SHAPES):
        ref = reference.softmax(x[:2].get(), axis=-1)
        _, auto = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
        for c in (2, 4, 8, 16):
            part = {"path": "cluster", "cluster": c}
            fn = lambda p=part: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p)  # noqa: E731
            err = bench.errors(fn()[:2], ref)["max_rel_err"]
            ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
            f = frac(rows, cols, dt, ms, copy)
            rows_out.append(dict(round=rnd, dtype=dname, cols=cols, rows=rows, C=c, auto=auto.chunks, ms=ms,
                                 frac_of_copy=f, max_rel_err=err))
            print(rnd, dname, cols, "C=%d%s" % (c, " (auto)" if c == auto.chunks else ""), "%.3f" % f,
                  "err %.1e" % err, flush=True)
        del x
bench.write_results(f"softmax_csize_probe_{bench.git_commit()[:7]}", rows_out, {"copy_GBps": copy})
