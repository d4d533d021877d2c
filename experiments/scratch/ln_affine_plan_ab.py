"""Probe (#4, scratch): where plain LayerNorm with weight and bias (of x's dtype) should take the cluster path once
both the cluster kernel's (20b5a00) and the register kernel's (b5a5b41) output loops are specialised for it:
norm.FWD_CLUSTER_LAYER_AFFINE 0 (never: norm_fwd / norm_fwd_stream), 2 (the default) and 4, at bfloat16
16K-32K and float32 8K-16K. Interleaved, three rounds, copy in the same run; max abs error of y against float64
on 256 rows.
    PYTHONPATH=. python experiments/scratch/ln_affine_plan_ab.py       (device)"""
import os

import cupy as cp

from cuflash import _dtypes, bench, norm as nm

NBYTES = 256 << 20
copy = bench.copy_bandwidth(NBYTES)
V = {"aff0": 0, "aff2": 2, "aff4": 4}
out = []
for dname, hidden in [("bfloat16", 16384), ("bfloat16", 32768), ("float32", 8192), ("float32", 16384)]:
    dt = getattr(_dtypes, dname)
    rows = NBYTES // (hidden * dt.itemsize)
    x = (cp.random.standard_normal((rows, hidden), dtype=cp.float32) * 2 + 1).astype(dt)
    w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
    h64 = x[sel].astype(cp.float64)
    m64 = h64.mean(-1)
    y64 = (h64 - m64[:, None]) / cp.sqrt(((h64 - m64[:, None]) ** 2).mean(-1) + 1e-5)[:, None] * w.astype(
        cp.float64) + b.astype(cp.float64)
    fr, path, err = {}, {}, {}
    for rnd in range(3):
        for v, lim in V.items():
            nm.FWD_CLUSTER_LAYER_AFFINE = lim
            pl = nm._fwd_config(nm.LAYER, x.dtype, w.dtype, hidden, False, x.device.id)
            path[v] = "stream" if pl.stream else f"cluster{pl.cluster}" if pl.cluster else "registers"
            call = lambda: nm.layer_norm(x, (hidden,), w, b)  # noqa: E731
            if rnd == 0:
                err[v] = float(cp.abs(call()[sel].astype(cp.float64) - y64).max())
            ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
            f = 2 * NBYTES / (ms * 1e-3) / 1e9 / copy
            out.append(dict(round=rnd, variant=v, dtype=dname, hidden=hidden, ms=ms, frac_of_copy=f, path=path[v],
                            max_abs_err=err[v]))
            fr.setdefault(v, []).append(f)
    print(dname, hidden, " | ".join(f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v]) for v in V),
          "| err", {v: "%.2g" % e for v, e in err.items()}, flush=True)
    del x
nm.FWD_CLUSTER_LAYER_AFFINE = 2
bench.write_results(f"ln_affine_plan_ab_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out,
                    {"copy_GBps": copy})
