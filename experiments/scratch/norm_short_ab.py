"""Probe (#4, scratch): the forward's geometry on short rows (1K-2K), where the Triton one-row-per-program norm led
the sweep by 1-2 % (float32 LayerNorm / RMSNorm 1K, bfloat16 RMSNorm 1K). Variants of cuflash.norm's planner
settings: the warp path (WARP_ROWS = 1, main; 2), and the block path (WARP_ROWS = 0) with NV = 4, 2, 1 vectors a
thread in registers (G = 64, 128, 256 threads on a float32 1K row; held weight chunks clamped to NV). LayerNorm
with weight and bias and RMSNorm with weight, of x's dtype, at 256 MiB; three interleaved rounds, the Triton peer
of norm_sweep.py and a copy of the same bytes in the same run; max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/norm_short_ab.py          (device)"""
import os
import sys

import cupy as cp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cuflash import _dtypes, bench, norm as nm  # noqa: E402
from norm_sweep import triton_peers  # noqa: E402

NBYTES = 256 << 20
VARIANTS = {"warp1": dict(WARP_ROWS=1), "warp2": dict(WARP_ROWS=2), "blk4": dict(WARP_ROWS=0, NV=4),
            "blk2": dict(WARP_ROWS=0, NV=2), "blk1": dict(WARP_ROWS=0, NV=1)}
SHAPES = [(k, d, h) for h in (1024, 2048) for d in ("float32", "bfloat16") for k in ("layer", "rms")]


def main():
    import torch
    tri = triton_peers()
    saved = dict(WARP_ROWS=nm.WARP_ROWS, NV=nm.NV)
    held0 = nm._held
    nm._held = lambda table, dt, wdt: min(held0(table, dt, wdt), nm.NV)  # noqa: E731
    out = []
    for kind, dname, hidden in SHAPES:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (hidden * dt.itemsize)
        x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
        w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
        x64 = x[sel].astype(cp.float64)
        if kind == "layer":
            d64 = x64 - x64.mean(-1)[:, None]
            y64 = d64 / cp.sqrt((d64 ** 2).mean(-1) + 1e-5)[:, None] * w.astype(cp.float64) + b.astype(cp.float64)
            call = lambda: nm.layer_norm(x, (hidden,), w, b)  # noqa: E731
        else:
            y64 = x64 / cp.sqrt((x64 ** 2).mean(-1) + 1e-6)[:, None] * w.astype(cp.float64)
            call = lambda: nm.rms_norm(x, (hidden,), w, eps=1e-6)  # noqa: E731
        tx, tw, tb = (torch.from_dlpack(v) for v in (x, w, b))
        ty = torch.empty_like(tx)
        tcall = lambda: tri(kind, tx, tw, tb, ty, 1e-5 if kind == "layer" else 1e-6)  # noqa: E731
        cbuf = cp.empty_like(x)
        ccall = lambda: cbuf.__setitem__(Ellipsis, x)  # noqa: E731
        fr, path, err = {}, {}, {}
        for rnd in range(3):
            cms = bench.time_cuda(ccall, warmup=3, rep=30)["median_ms"]
            for v, settings in list(VARIANTS.items()) + [("triton", None)]:
                if settings is None:
                    ms = bench.time_cuda(tcall, warmup=3, rep=30)["median_ms"]
                    path[v] = "triton"
                else:
                    for k, val in settings.items():
                        setattr(nm, k, val)
                    nm._FWD_CFG.clear()
                    pl = nm._fwd_config(nm.LAYER if kind == "layer" else nm.RMS, x.dtype, w.dtype, hidden, False,
                                        x.device.id)
                    path[v] = "stream" if pl.stream else f"cluster{pl.cluster}" if pl.cluster else \
                        f"reg G={pl.G} rpb={pl.rpb}"
                    if rnd == 0:
                        y = call()
                        err[v] = float(cp.abs(y[sel].astype(cp.float64) - y64).max())
                    ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
                f = cms / ms
                out.append(dict(round=rnd, variant=v, kind=kind, dtype=dname, hidden=hidden, ms=ms, copy_ms=cms,
                                frac_of_copy=f, path=path[v], max_abs_err=err.get(v)))
                fr.setdefault(v, []).append(f)
        print(kind, dname, hidden, " | ".join(f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v])
                                             for v in fr), "| err", {v: "%.2g" % e for v, e in err.items()},
              flush=True)
        del x, tx, ty, cbuf
    for k, val in saved.items():
        setattr(nm, k, val)
    nm._held = held0
    bench.write_results(f"norm_short_ab_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out, {})


if __name__ == "__main__":
    main()
