"""Probe (#3, scratch): the cluster kernel at every cluster size C for rows of 128 KiB - 2 MiB (float32 32K-512K,
bfloat16 64K-1M columns; C with at most 128 KiB a block), copy in the same run; one round per process (run it in
two trees, interleaved, for a same-run A/B of the kernel). Writes experiments/results/NAME.json.
    PYTHONPATH=. python experiments/scratch/softmax_bulk_map.py NAME"""
import sys

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

from cuflash import reference

SHAPES = [("float32", 1 << k) for k in range(15, 20)] + [("bfloat16", 1 << k) for k in range(16, 21)]
rows_out = []
copy = copy_bandwidth()
for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    ref = reference.softmax(x[:2].get(), axis=-1)
    _, auto = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
    for c in (2, 4, 8, 16):
        if cols * dt.itemsize > c * (128 << 10):
            continue
        part = {"path": "cluster", "cluster": c}
        fn = lambda p=part: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p)  # noqa: E731
        err = bench.errors(fn()[:2], ref)["max_rel_err"]
        ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
        rows_out.append(dict(dtype=dname, cols=cols, rows=rows, C=c, auto=auto.chunks, auto_path=auto.path, ms=ms,
                             frac_of_copy=frac(rows, cols, dt, ms, copy), max_rel_err=err))
    del x
bench.write_results(sys.argv[1], rows_out, {"copy_GBps": copy})
