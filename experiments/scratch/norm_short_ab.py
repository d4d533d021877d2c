"""Probe (#4, scratch): the forward's geometry on short rows, where the Triton one-row-per-program norm led the
sweep by 1-2 % (float32 LayerNorm / RMSNorm 1K, bfloat16 RMSNorm 1K). Variants of cuflash.norm's planner settings,
each applied over main's (restored after):
  run 1 (6f341f7, norm_short_ab_6f341f7.json; hidden 1K-2K, no residual): the warp path (WARP_ROWS = 1, main; 2)
  and the block path (WARP_ROWS = 0) with NV = 4, 2, 1 vectors a thread (held weight chunks clamped to NV). Found:
  float32 1K on the block path at NV = 4 (G = 64) 0.985-0.987 of copy against the warp path's 0.962-0.968 and
  Triton's 0.984-0.991; NV = 2 / 1 lose 6-45 %; bfloat16 1K even (0.980-0.985); WARP_ROWS = 2 -1 %. (Its 2K warp
  rows ran with NV left at 1 by the variant before: ignore them.)
  run 2 (91d2ded, norm_short_ab_91d2ded.json; hidden 512-1K, with and without residual): main (NV_WARP_BYTES =
  128: a float32 lane holds up to 8 vectors, rows to 1K on the warp path), "w64" (NV_WARP_BYTES = 64: float32 rows
  over 512 on the block path, 16-bit unchanged), "blk" (WARP_ROWS = 0: every row on the block path). Found: float32
  1K +1.6-2 % as blocks (with residual too), 768 LayerNorm -1.3 % (residual -5 %), 512 even; bfloat16 1K even but
  RMSNorm +1.7 % (residual even, LayerNorm with residual -0.8 %).
  run 3 (522f164, norm_short_ab_522f164.json): main (NV_WARP_BYTES = 96: float32 rows to 768 on the warp path, 6
  vectors a lane) against the 128 of before, float32 512-1K with and without residual. Found: 1K +1.5-2 %, 512-768
  within 0.5 % (landed).
  run 4 (4d231be, norm_short_ab_4d231be.json; the rows Triton still led in 522f164's sweep, bfloat16 RMSNorm 1K
  and float32 RMSNorm 8K, and their neighbours, no residual): "w4", the warp path's kernels at launch bounds of 4
  blocks of 256 threads (64 registers, so 32 one-warp blocks an SM instead of 25 at the 80 of 3 blocks; RMSNorm
  holds 2 weight chunks, not 4, to fit); "blk", every row on the block path; "nocl", no cluster path (RMSNorm
  8K-16K on the register kernel).
  Found: bfloat16 RMSNorm 1K 0.975 -> 0.990 (w4) / 0.994 (blk), 512 0.758 -> 0.787 (both; Triton 0.988 / 0.787);
  float32 RMSNorm 512 -1.4 % (w4) / -0.8 % (blk), 768 -0.8 / +0.4 %; bfloat16 LayerNorm 1K even; float32 RMSNorm
  8K on the register kernel 0.966 -> 0.983 (Triton 0.977), bfloat16 16K there 0.970 -> 0.921.
  run 5 (VARIANTS below): main's new settings (WARP_RMS16 = False, FWD_CLUSTER_RMS32_WHOLE = False: 16-bit RMSNorm
  rows without residual on the block path, float32 RMSNorm 8K on the register kernel) against the old ones. Its
  labels do not tell the warp path from the block path (bfloat16 256: old warp, main block); later runs say "warp".
LayerNorm with weight and bias and RMSNorm with weight, of x's dtype, at 256 MiB of x; three interleaved rounds,
the Triton peer of norm_sweep.py (no residual) and a copy of x in the same run (frac = bytes moved over the copy's
rate); max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/norm_short_ab.py          (device)"""
import os
import sys

import cupy as cp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cuflash import _dtypes, bench, norm as nm  # noqa: E402
from norm_sweep import triton_peers  # noqa: E402

NBYTES = 256 << 20
VARIANTS = {"main": {}, "old": dict(WARP_RMS16=True, FWD_CLUSTER_RMS32_WHOLE=True)}
SHAPES = ([("rms", "bfloat16", h, False) for h in (256, 512, 1000, 1024)] + [("rms", "float16", 1024, False)]
          + [("rms", "float32", h, False) for h in (6144, 8192)])
# run 4's VARIANTS: {"main": {}, "w4": dict(_fwd_name="w4"), "blk": dict(WARP_ROWS=0),
#                    "nocl": dict(FWD_CLUSTER_SIZES=())}
_fwd_name0 = nm._fwd_name


def _fwd_name_w4(dt, wdt, kind, res=False, warp=False, *a, **k):
    """run 4's "w4": the warp kernels' launch bounds at 4 blocks (64 registers), RMSNorm's held chunks at most 2."""
    name = _fwd_name0(dt, wdt, kind, res, warp, *a, **k)
    if not warp or res:
        return name
    args = name[name.index("<") + 1:-1].split(", ")
    args[4] = str(min(int(args[4]), 2))  # NH
    args[5] = "4"  # MINB
    return name[:name.index("<") + 1] + ", ".join(args) + ">"


SETTINGS = {"w4": _fwd_name_w4}


def _warp_kernel(name):
    """Whether a norm_fwd instantiation name is the warp-per-row kernel (its WARP template argument)."""
    return name[name.index("<") + 1:-1].split(", ")[7] == "true"


def main():
    import torch
    tri = triton_peers()
    keys = sorted({k for v in VARIANTS.values() for k in v})
    saved = {k: getattr(nm, k) for k in keys}
    out = []
    for kind, dname, hidden, res in SHAPES:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (hidden * dt.itemsize)
        x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
        r = (0.5 * cp.random.standard_normal((rows, hidden), dtype=cp.float32)).astype(dt) if res else None
        w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
        h64 = x[sel].astype(cp.float64) + (r[sel].astype(cp.float64) if res else 0)
        if kind == "layer":
            d64 = h64 - h64.mean(-1)[:, None]
            y64 = d64 / cp.sqrt((d64 ** 2).mean(-1) + 1e-5)[:, None] * w.astype(cp.float64) + b.astype(cp.float64)
            call = lambda: nm.layer_norm(x, (hidden,), w, b, residual=r)  # noqa: E731
        else:
            y64 = h64 / cp.sqrt((h64 ** 2).mean(-1) + 1e-6)[:, None] * w.astype(cp.float64)
            call = lambda: nm.rms_norm(x, (hidden,), w, eps=1e-6, residual=r)  # noqa: E731
        tcall = None
        if not res:
            tx, tw, tb = (torch.from_dlpack(v) for v in (x, w, b))
            ty = torch.empty_like(tx)
            tcall = lambda: tri(kind, tx, tw, tb, ty, 1e-5 if kind == "layer" else 1e-6)  # noqa: E731
        cbuf = cp.empty_like(x)
        ccall = lambda: cbuf.data.copy_from_device_async(x.data, x.nbytes)  # noqa: E731
        moved = 4 if res else 2  # arrays of x's size read or written (copy: 2)
        fr, path, err = {}, {}, {}
        for rnd in range(3):
            cms = bench.time_cuda(ccall, warmup=3, rep=30)["median_ms"]
            for v, settings in list(VARIANTS.items()) + ([("triton", None)] if tcall else []):
                if settings is None:
                    ms = bench.time_cuda(tcall, warmup=3, rep=30)["median_ms"]
                    path[v] = "triton"
                else:
                    for k in keys:
                        val = settings.get(k, saved[k])
                        setattr(nm, k, SETTINGS.get(val, val) if isinstance(val, str) else val)
                    nm._FWD_CFG.clear()
                    asked = []  # the register kernel's name, if the plan asks for one (warp or block path)
                    inner = nm._fwd_name
                    nm._fwd_name = lambda *a, **k: asked.append(inner(*a, **k)) or asked[-1]  # noqa: E731
                    pl = nm._fwd_config(nm.LAYER if kind == "layer" else nm.RMS, x.dtype, w.dtype, hidden, res,
                                        x.device.id)
                    nm._fwd_name = inner
                    warp = " warp" if asked and _warp_kernel(asked[-1]) else ""
                    path[v] = "stream" if pl.stream else f"cluster{pl.cluster}" if pl.cluster else \
                        f"reg G={pl.G} rpb={pl.rpb} n={pl.nchunks}{warp}"
                    if rnd == 0:
                        y = call()
                        y = y[0] if res else y
                        err[v] = float(cp.abs(y[sel].astype(cp.float64) - y64).max())
                    ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
                f = cms * moved / 2 / ms
                out.append(dict(round=rnd, variant=v, kind=kind, dtype=dname, hidden=hidden, res=res, ms=ms,
                                copy_ms=cms, frac_of_copy=f, path=path[v], max_abs_err=err.get(v)))
                fr.setdefault(v, []).append(f)
        print(kind, dname, hidden, "res" if res else "", " | ".join(
            f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v]) for v in fr),
            "| err", {v: "%.2g" % e for v, e in err.items()}, flush=True)
        del x, r, cbuf
    for k, val in saved.items():
        setattr(nm, k, val)
    nm._FWD_CFG.clear()
    bench.write_results(f"norm_short_ab_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out, {})


if __name__ == "__main__":
    main()
