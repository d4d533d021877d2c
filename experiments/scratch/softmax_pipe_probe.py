"""Probe for #3 (softmax long rows): the planner's choice, the planner without the cluster path (block / split) and
the cluster path forced at each C, at 256 MiB, bf16 and float32, with a same-run copy (run from a second tree too,
for a same-run A/B: cd abm && PYTHONPATH=. python ../experiments/scratch/softmax_pipe_probe.py --name ...).
    python experiments/scratch/softmax_pipe_probe.py [--cols 8192,...] [--dtypes bfloat16,float32]
Prints GB/s (read + write) and the fraction of the copy per variant; writes experiments/results/<name>.json."""
import argparse
import importlib
import sys

sys.path.insert(0, "experiments")  # (the tree it runs in)
from softmax_sweep import copy_bandwidth  # noqa: E402

from cuflash import _dtypes, bench, reference  # noqa: E402

sm = importlib.import_module("cuflash.softmax")
ap = argparse.ArgumentParser()
ap.add_argument("--cols", default="8192,16384,32768,65536,131072,262144,524288,1048576")
ap.add_argument("--dtypes", default="bfloat16,float32")
ap.add_argument("--sizes", default="1,2,4,8")
ap.add_argument("--rep", type=int, default=20)
ap.add_argument("--holds", default="", help="also the cluster path with these hold_bytes (shared memory per block)")
ap.add_argument("--name", default="softmax_pipe_probe")
a = ap.parse_args()
import cupy as cp  # noqa: E402

nbytes = 256 << 20
copy = copy_bandwidth(nbytes, a.rep)
print(f"copy {copy:.0f} GB/s")
out = []
for dname in a.dtypes.split(","):
    dt = getattr(_dtypes, dname)
    for cols in map(int, a.cols.split(",")):
        rows = max(1, nbytes // (cols * dt.itemsize))
        x = cp.random.standard_normal((rows, cols), dtype=cp.float32).astype(dt)
        ref = reference.softmax(x[[0, rows - 1]].get(), axis=-1)
        variants = {"auto": None, "nocluster": {"cluster": 0}}
        for c in map(int, a.sizes.split(",")):
            if cols * dt.itemsize > c * (1 << 20):
                continue
            variants[f"C{c}"] = {"path": "cluster", "cluster": c}
            for h in (int(v) for v in a.holds.split(",") if v):
                variants[f"C{c}h{h >> 10}K"] = {"path": "cluster", "cluster": c, "hold_bytes": h}
        line = [f"{dname:8s} {rows:6d}x{cols:<8d}"]
        for name, part in variants.items():
            try:
                y, pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", part, return_plan=True)
                err = bench.errors(y[[0, rows - 1]], ref)["max_rel_err"]
                del y
                ms = bench.time_cuda(lambda p=part, x=x: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p),
                                     warmup=3, rep=a.rep)["median_ms"]
            except Exception as ex:
                print(name, type(ex).__name__, str(ex)[:200])
                continue
            g = 2 * rows * cols * dt.itemsize / (ms * 1e-3) / 1e9
            out.append(dict(dtype=dname, rows=rows, cols=cols, variant=name, path=pl.path, chunks=pl.chunks,
                            ms=ms, GBps=g, frac_of_copy=g / copy, max_rel_err=err, copy_GBps=copy))
            line.append(f"{name}={pl.path}{pl.chunks} {g / copy:.3f}")
        print("  ".join(line), flush=True)
        del x
bench.write_results(a.name, out, {"copy_GBps": copy})
