"""Scratch helper of the plain-LayerNorm planner A/B probes (ln_cluster_ab.py, ln_affine_plan_ab.py): each variant
sets some of cuflash.norm's planner settings; plain LayerNorm with weight and bias of x's dtype, rows of mean loc
and std scale at 256 MiB, three interleaved rounds, copy in the same run, max abs error of y against float64 on
256 rows. Rows go to experiments/results/<name>_<commit>.json; the settings are restored after."""
import os

import cupy as cp

from cuflash import _dtypes, bench, norm as nm

NBYTES = 256 << 20


def run(name, variants, shapes, loc=0.0, scale=1.0):
    """variants: name -> {norm setting: value}; shapes: (dtype name, hidden) pairs."""
    saved = {k: getattr(nm, k) for v in variants.values() for k in v}
    copy = bench.copy_bandwidth(NBYTES)
    out = []
    for dname, hidden in shapes:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (hidden * dt.itemsize)
        x = (cp.random.standard_normal((rows, hidden), dtype=cp.float32) * scale + loc).astype(dt)
        w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
        x64 = x[sel].astype(cp.float64)
        m64 = x64.mean(-1)
        y64 = (x64 - m64[:, None]) / cp.sqrt(((x64 - m64[:, None]) ** 2).mean(-1) + 1e-5)[:, None] * w.astype(
            cp.float64) + b.astype(cp.float64)
        call = lambda: nm.layer_norm(x, (hidden,), w, b)  # noqa: E731
        fr, path, err = {}, {}, {}
        for rnd in range(3):
            for v, settings in variants.items():
                for k, val in settings.items():
                    setattr(nm, k, val)
                pl = nm._fwd_config(nm.LAYER, x.dtype, w.dtype, hidden, False, x.device.id)
                path[v] = "stream" if pl.stream else f"cluster{pl.cluster}{'h' if pl.smem else ''}" if pl.cluster \
                    else "registers"
                if rnd == 0:
                    err[v] = float(cp.abs(call()[sel].astype(cp.float64) - y64).max())
                ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
                f = 2 * NBYTES / (ms * 1e-3) / 1e9 / copy
                out.append(dict(round=rnd, variant=v, dtype=dname, hidden=hidden, ms=ms, frac_of_copy=f,
                                path=path[v], max_abs_err=err[v]))
                fr.setdefault(v, []).append(f)
        print(dname, hidden, " | ".join(f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v]) for v in variants),
              "| err", {v: "%.2g" % e for v, e in err.items()}, flush=True)
        del x
    for k, val in saved.items():
        setattr(nm, k, val)
    bench.write_results(f"{name}_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out,
                        {"copy_GBps": copy})
