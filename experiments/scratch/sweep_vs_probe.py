"""Scratch (#3): why softmax_sweep.py's cluster rows (bf16 128K 0.85 of copy) time slower than
softmax_csize_probe.py's (0.89) for the same kernel and plan. Same process: the sweep's main on the row, then the
probe's way, then variants (public call, fresh input, preallocated output, torch imported / not)."""
import importlib
import sys

sys.path.insert(0, "experiments")
import cupy as cp  # noqa: E402

import softmax_sweep as sw  # noqa: E402
from cuflash import _dtypes, bench  # noqa: E402

sm = importlib.import_module("cuflash.softmax")
copy = sw.copy_bandwidth(256 << 20, 30)
for dname, cols in (("bfloat16", 131072), ("float32", 65536)):
    rows_sw = sw.run(sw.parse_args(["--cols", str(cols), "--dtypes", dname, "--methods", "online", "--no-peers",
                                    "--rep", "30", "--name", f"svp_{dname}_{cols}"]))
    r = [q for q in rows_sw if q["impl"] == "cuflash"][0]
    print("sweep main:", dname, cols, "ms %.4f frac %.3f (its copy %.0f)" % (r["ms"], r["frac_of_copy"], r["copy_GBps"]))
    dt = getattr(_dtypes, dname)
    rows = (256 << 20) // (cols * dt.itemsize)
    useful = 2 * rows * cols * dt.itemsize
    x, _ = sw._inputs(rows, cols, dname, None)
    y = cp.empty_like(x)
    pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
    auto = {"path": "cluster", "cluster": pr.plan.chunks}
    variants = {
        "public softmax(x, axis=-1)": lambda: sm.softmax(x, axis=-1),
        "_softmax_impl(x, -1, partition=forced C)": lambda: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", auto),
        "_exec into a preallocated y": lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y),
    }
    for rnd in range(3):
        for name, fn in variants.items():
            t = bench.time_cuda(fn, warmup=3, rep=30)
            print(rnd, dname, cols, name, "median %.4f min %.4f p80 %.4f ms, frac %.3f" % (
                t["median_ms"], t["min_ms"], t["p80_ms"], useful / (t["median_ms"] * 1e-3) / 1e9 / copy))
    del x, y
print("copy", copy)
