"""Probe (#4, scratch): where plain LayerNorm's forward loses to RMSNorm on the same kernels: LayerNorm with
weight and bias, weight only, neither, and RMSNorm with weight, at 8K-32K (bfloat16, float32), same run, three
interleaved rounds, copy in the same run; the path each took (registers / stream / cluster).
    PYTHONPATH=. python experiments/scratch/ln_affine_cost.py       (device)"""
import cupy as cp

from cuflash import _dtypes, bench, norm as nm

NBYTES = 256 << 20
copy = bench.copy_bandwidth(NBYTES)
out = []
for dname, hidden in [("bfloat16", 8192), ("bfloat16", 16384), ("bfloat16", 32768), ("float32", 16384),
                      ("float32", 32768)]:
    dt = getattr(_dtypes, dname)
    rows = NBYTES // (hidden * dt.itemsize)
    x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
    w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    V = {"ln_wb": (nm.LAYER, lambda: nm.layer_norm(x, (hidden,), w, b), True),
         "ln_w": (nm.LAYER, lambda: nm.layer_norm(x, (hidden,), w, None), True),
         "ln_none": (nm.LAYER, lambda: nm.layer_norm(x, (hidden,)), False),
         "rms_w": (nm.RMS, lambda: nm.rms_norm(x, (hidden,), w), True)}
    fr, path = {}, {}
    for rnd in range(3):
        for v, (kind, call, aff) in V.items():
            pl = nm._fwd_config(kind, x.dtype, w.dtype, hidden, False, x.device.id, affine=aff)
            path[v] = "stream" if pl.stream else "cluster" if pl.cluster else "registers"
            ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
            f = 2 * NBYTES / (ms * 1e-3) / 1e9 / copy
            out.append(dict(round=rnd, variant=v, dtype=dname, hidden=hidden, ms=ms, frac_of_copy=f, path=path[v]))
            fr.setdefault(v, []).append(f)
    print(dname, hidden, " | ".join(f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v]) for v in V),
          flush=True)
    del x
bench.write_results(f"ln_affine_cost_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
