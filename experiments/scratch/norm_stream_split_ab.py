"""Probe (#4, scratch): the streamed forward's (norm_fwd_stream) own output loop for plain LayerNorm with weight
and bias (CUFLASH_SSPLIT=1, as norm_fwd's since f788cba) with its per-row-weights loop unrolled once
(CUFLASH_SUNROLL=1: at 2 or 4 the split kernels spill 12-28 bytes), against the one loop at unroll 4 (as at
b838f6c) and the one loop at unroll 1; at the rows that take the streamed kernel (plain LayerNorm bfloat16 32K and
64K, float32 16K and 64K) and an RMSNorm row on it (bfloat16 64K, the general loop). Interleaved, three rounds,
copy in the same run; each variant's kernel checked by its options; max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/norm_stream_split_ab.py       (device)"""
import os

import cupy as cp

from cuflash import _compile, _dtypes, bench, norm as nm

NBYTES = 256 << 20
copy = bench.copy_bandwidth(NBYTES)
get_kernel = _compile.get_kernel
VARIANTS = {"split": ("-DCUFLASH_SSPLIT=1", "-DCUFLASH_SUNROLL=1"),
            "old": ("-DCUFLASH_SSPLIT=0", "-DCUFLASH_SUNROLL=4"),
            "old_u1": ("-DCUFLASH_SSPLIT=0", "-DCUFLASH_SUNROLL=1")}


def use(variant, plain):
    opt = VARIANTS[variant]
    _compile.get_kernel = lambda src, name, extra=(): get_kernel(src, name, tuple(extra) + opt)
    nm._FWD_CFG.clear()
    nm.FWD_CLUSTER_PLAIN_LAYER = plain


out = []
# (kind, dtype, hidden, residual, affine, forced onto the cluster path)
CASES = [("layer", d, h, False, True, False) for d, h in [("bfloat16", 32768), ("float32", 16384), ("bfloat16", 65536),
                                                           ("float32", 65536)]]
CASES += [("rms", "bfloat16", 65536, False, True, False)]
for kind, dname, hidden, res, affine, plain in CASES:
    dt = getattr(_dtypes, dname)
    rows = NBYTES // (hidden * dt.itemsize)
    x = (cp.random.standard_normal((rows, hidden), dtype=cp.float32) * 2 + 1).astype(dt)
    r = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt) if res else None
    w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine else None
    b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine and kind == "layer" else None
    sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
    h64 = x[sel].astype(cp.float64) if r is None else (x[sel].astype(cp.float32) + r[sel].astype(cp.float32)).astype(
        dt).astype(cp.float64)
    if kind == "layer":
        m64 = h64.mean(-1)
        y64 = (h64 - m64[:, None]) / cp.sqrt(((h64 - m64[:, None]) ** 2).mean(-1) + 1e-5)[:, None]
        call = lambda: nm.layer_norm(x, (hidden,), w, b, residual=r)  # noqa: E731
    else:
        y64 = h64 / cp.sqrt((h64 ** 2).mean(-1) + _dtypes.eps(dt))[:, None]
        call = lambda: nm.rms_norm(x, (hidden,), w, residual=r)  # noqa: E731
    if w is not None:
        y64 = y64 * w.astype(cp.float64)
    if b is not None:
        y64 = y64 + b.astype(cp.float64)
    nbytes = NBYTES * (4 if res else 2)
    fr, path, err = {}, {}, {}
    for rnd in range(3):
        for v in VARIANTS:
            use(v, plain)
            pl = nm._fwd_config(nm.LAYER if kind == "layer" else nm.RMS, x.dtype, x.dtype, hidden, res,
                                x.device.id, affine=affine)
            if pl.stream:
                opts = [key[2] for key, k in _compile._KERNELS.items() if k is pl.kern]
                assert len(opts) == 1 and all(o in opts[0] for o in VARIANTS[v]), (v, opts)
            path[v] = "stream" if pl.stream else f"cluster{pl.cluster}/{pl.smem >> 10}K" if pl.cluster \
                else "registers"
            if rnd == 0:
                o = call()
                y = o[0] if isinstance(o, tuple) else o
                err[v] = float(cp.abs(y[sel].astype(cp.float64) - y64).max())
                del o, y
            ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
            f = nbytes / (ms * 1e-3) / 1e9 / copy
            out.append(dict(round=rnd, variant=v, kind=kind, residual=res, affine=affine, forced=plain, dtype=dname,
                            hidden=hidden, ms=ms, frac_of_copy=f, path=path[v], max_abs_err=err[v]))
            fr.setdefault(v, []).append(f)
    print(kind, "res" if res else "   ", "aff" if affine else "   ", dname, hidden, " | ".join(
        f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v]) for v in VARIANTS),
          "| split/old x%.3f old_u1/old x%.3f" % (max(fr["split"]) / max(fr["old"]),
                                                   max(fr["old_u1"]) / max(fr["old"])),
          "| err", {v: "%.2g" % e for v, e in err.items()}, flush=True)
    del x, r
_compile.get_kernel = get_kernel
nm.FWD_CLUSTER_PLAIN_LAYER = False
bench.write_results(f"norm_stream_split_ab_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out,
                    {"copy_GBps": copy})
