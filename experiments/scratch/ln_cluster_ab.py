"""Probe (#4, scratch): plain LayerNorm (weight and bias) on the cluster path (norm.FWD_CLUSTER_PLAIN_LAYER, and
with its weights held in shared memory, FWD_CLUSTER_HOLD) against the default plan, bfloat16 16K-32K and float32
8K-32K, same run, three interleaved rounds, copy in the same run, max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/ln_cluster_ab.py       (device)"""
import cupy as cp

from cuflash import _dtypes, bench, norm as nm

NBYTES = 256 << 20
copy = bench.copy_bandwidth(NBYTES)
V = {"default": (False, False), "cluster": (True, False), "cluster_hold": (True, True)}
out = []
for dname, hidden in [("bfloat16", 16384), ("bfloat16", 32768), ("float32", 8192), ("float32", 16384),
                      ("float32", 32768)]:
    dt = getattr(_dtypes, dname)
    rows = NBYTES // (hidden * dt.itemsize)
    x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
    w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
    x64 = x[sel].astype(cp.float64)
    m64 = x64.mean(-1)
    y64 = (x64 - m64[:, None]) / cp.sqrt(((x64 - m64[:, None]) ** 2).mean(-1) + 1e-5)[:, None] * w.astype(
        cp.float64) + b.astype(cp.float64)
    fr, path, err = {}, {}, {}
    for rnd in range(3):
        for v, (plain, hold) in V.items():
            nm.FWD_CLUSTER_PLAIN_LAYER, nm.FWD_CLUSTER_HOLD = plain, hold
            pl = nm._fwd_config(nm.LAYER, x.dtype, w.dtype, hidden, False, x.device.id)
            path[v] = "stream" if pl.stream else f"cluster{pl.cluster}{'h' if pl.smem else ''}" if pl.cluster \
                else "registers"
            if rnd == 0:
                err[v] = float(cp.abs(nm.layer_norm(x, (hidden,), w, b)[sel].astype(cp.float64) - y64).max())
            ms = bench.time_cuda(lambda: nm.layer_norm(x, (hidden,), w, b), warmup=3, rep=30)["median_ms"]
            f = 2 * NBYTES / (ms * 1e-3) / 1e9 / copy
            out.append(dict(round=rnd, variant=v, dtype=dname, hidden=hidden, ms=ms, frac_of_copy=f, path=path[v],
                            max_abs_err=err[v]))
            fr.setdefault(v, []).append(f)
    print(dname, hidden, " | ".join(f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v]) for v in V),
          "| err", {v: "%.2g" % e for v, e in err.items()}, flush=True)
    del x
nm.FWD_CLUSTER_PLAIN_LAYER, nm.FWD_CLUSTER_HOLD = False, False
bench.write_results(f"ln_cluster_ab_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
