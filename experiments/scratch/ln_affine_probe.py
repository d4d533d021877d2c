"""Probe (scratch, #4): does plain LayerNorm at large hidden lose to RMSNorm because every row re-reads its weight
and bias (2x the bytes of x in 16-bit, against RMSNorm's 1x)? Forward GB/s (x read + y written) of layer_norm with
(weight, bias) / weight only / neither, and rms_norm with / without weight, ~256 MiB of x, inputs rotated past L2,
a device copy in the same run. If LayerNorm without the affine parameters reaches RMSNorm's speed, the weight
traffic is the cause.   python experiments/scratch/ln_affine_probe.py [--hidden 8192 16384 32768 65536]
Writes experiments/results/ln_affine_probe.json."""
import argparse
import sys

sys.path.insert(0, ".")
import cupy as cp  # noqa: E402

import cuflash  # noqa: E402
from cuflash import bench  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--hidden", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
ap.add_argument("--rep", type=int, default=30)
ap.add_argument("--name", default="ln_affine_probe")
ap.add_argument("--set", nargs="*", default=[], metavar="NAME=INT",
                help="cuflash.norm settings for the run, e.g. FWD_CLUSTER_PLAIN_LAYER=1 FWD_CLUSTER_HOLD=1")
a = ap.parse_args()
import cuflash.norm as _norm  # noqa: E402

for kv in a.set:
    key, val = kv.split("=")
    assert hasattr(_norm, key), key
    setattr(_norm, key, int(val))

def copy_gbps():
    src = cp.empty(1 << 28, dtype=cp.uint8)
    dst = cp.empty_like(src)
    return 2 * src.nbytes / (bench.time_cuda(lambda: cp.copyto(dst, src), rep=a.rep)["median_ms"] * 1e-3) / 1e9


copy = copy_gbps()
rows = []
for dtn in a.dtypes:
    dt = getattr(cuflash, dtn) if dtn == "bfloat16" else cp.dtype(dtn)
    for hidden in a.hidden:
        tokens = max(1, (256 << 20) // (hidden * cp.dtype(dt).itemsize))
        xs = [cp.random.standard_normal((tokens, hidden), dtype=cp.float32).astype(dt) for _ in range(2)]
        w = cp.random.standard_normal(hidden, dtype=cp.float32).astype(dt)
        b = cp.random.standard_normal(hidden, dtype=cp.float32).astype(dt)
        calls = {"layer_wb": lambda x: cuflash.layer_norm(x, hidden, w, b),
                 "layer_w": lambda x: cuflash.layer_norm(x, hidden, w, None),
                 "layer": lambda x: cuflash.layer_norm(x, hidden, None, None),
                 "rms_w": lambda x: cuflash.rms_norm(x, hidden, w),
                 "rms": lambda x: cuflash.rms_norm(x, hidden, None)}
        row = {"dtype": dtn, "tokens": tokens, "hidden": hidden}
        for rnd in range(2):  # interleaved, best median of the two rounds
            for name, f in calls.items():
                t = bench.time_cuda(f, *[(x,) for x in xs], rep=a.rep)["median_ms"]
                row[name + "_ms"] = min(t, row.get(name + "_ms", t))
        nbytes = 2 * xs[0].nbytes
        for name in calls:
            row[name + "_x_copy"] = nbytes / (row[name + "_ms"] * 1e-3) / 1e9 / copy
        rows.append(row)
        del xs
        cp.get_default_memory_pool().free_all_blocks()
path = bench.write_results(a.name, rows, {"settings": a.set, "what": __doc__.split("\n")[0], "copy_GBps": copy,
                                                     "timing": f"CUDA events, median of {a.rep}, 2 input sets rotated, "
                                                               "two interleaved rounds, best"})
print(f"copy {copy:.0f} GB/s")
print(bench.table(rows, ["dtype", "hidden"] + [n + "_x_copy" for n in ("layer_wb", "layer_w", "layer", "rms_w", "rms")]))
print("wrote", path)
