"""Probe (scratch, #3 / #4): the rows nearest the 0.9-of-copy line, each timed in rotated rounds beside a copy of
the same bytes (bench.time_rotated), instead of against one copy timed at the start of the sweep: softmax 16-bit
32K and 256K columns, plain LayerNorm forward float32 16K / 32K and bfloat16 8K-32K (weight and bias), ~256 MiB
of input. Prints per row the median of the round ratios (copy time / kernel time, the bytes the op must move) and
the sweep-style ratio against the copy timed once first. Writes experiments/results/membound_rot_probe_<commit>.json.
    python experiments/scratch/membound_rot_probe.py [--rounds 8]"""
import argparse, sys
sys.path.insert(0, ".")
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--rep", type=int, default=10)
a = ap.parse_args()

import cupy as cp
import cuflash
from cuflash import bench, traffic, _dtypes

MIB = 256 << 20
src0 = cp.empty(MIB, dtype=cp.uint8)
dst0 = cp.empty_like(src0)
t0 = bench.time_cuda(lambda: cp.copyto(dst0, src0), warmup=3, rep=30)["median_ms"]
copy_first = 2 * MIB / (t0 * 1e-3) / 1e9
del src0, dst0
rows = []
cases = [("softmax", "bfloat16", 32768), ("softmax", "float16", 32768), ("softmax", "bfloat16", 262144),
         ("layer_norm", "float32", 16384), ("layer_norm", "float32", 32768), ("layer_norm", "bfloat16", 8192),
         ("layer_norm", "bfloat16", 16384), ("layer_norm", "bfloat16", 32768)]
for op, dn, cols in cases:
    dt = np.dtype(getattr(_dtypes, dn)) if dn == "bfloat16" else np.dtype(dn)
    n = MIB // dt.itemsize // cols
    x = cp.random.standard_normal((n, cols), dtype=cp.float32).astype(dt)
    if op == "softmax":
        nbytes = 2 * x.nbytes
        f = lambda: cuflash.softmax(x, axis=-1)  # noqa: E731
    else:
        w = cp.random.standard_normal(cols, dtype=cp.float32).astype(dt)
        b = cp.random.standard_normal(cols, dtype=cp.float32).astype(dt)
        nbytes = traffic.norm_bytes(n, cols, dn, "layer")
        f = lambda: cuflash.layer_norm(x, (cols,), w, b)  # noqa: E731
    buf = cp.empty(nbytes // 2, dtype=cp.uint8)
    out = cp.empty_like(buf)
    t = bench.time_rotated({"copy": lambda: cp.copyto(out, buf), "cuflash": f}, rounds=a.rounds, rep=a.rep)
    ratios = np.asarray(t["copy"]["rounds_ms"]) / np.asarray(t["cuflash"]["rounds_ms"])
    gbps = nbytes / (t["cuflash"]["median_ms"] * 1e-3) / 1e9
    row = {"op": op, "dtype": dn, "rows": n, "cols": cols, "bytes": nbytes, "GBps": gbps,
           "copy_GBps": nbytes / (t["copy"]["median_ms"] * 1e-3) / 1e9, "x_copy_rotated": float(np.median(ratios)),
           "x_copy_rounds": [round(float(r), 4) for r in ratios], "x_copy_first": gbps / copy_first,
           "ms_cuflash": t["cuflash"]["rounds_ms"], "ms_copy": t["copy"]["rounds_ms"]}
    rows.append(row)
    print(f"{op:10s} {dn:8s} {n}x{cols}: {gbps:.0f} GB/s, x copy rotated {row['x_copy_rotated']:.3f} "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f}), x copy timed first {row['x_copy_first']:.3f}", flush=True)
    del x, buf, out
    cp.get_default_memory_pool().free_all_blocks()
print(f"copy timed first: {copy_first:.0f} GB/s")
print("wrote", bench.write_results(f"membound_rot_probe_{bench.git_commit()[:7]}", rows, {"copy_first_GBps": copy_first}))
