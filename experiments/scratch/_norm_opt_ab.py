"""Scratch helper of the norm forward A/B probes (norm_emit_ab.py, norm_fwd_split_ab.py, norm_stream_split_ab.py):
each variant compiles norm.cu with its own -D options; cases are interleaved over three rounds with the copy of the
same run as the ceiling; the kernel of each plan a predicate picks is checked to carry its variant's options; max
abs error of y against float64 on 256 rows. Rows go to experiments/results/<name>_<commit>.json. The probes' -D
macros exist only at the commits they ran at (20b5a00, b5a5b41, 0abf0e2; run from a checkout of that commit): main
keeps the measured form alone. The loop was written three times in those probes and is shared here since."""
import os

import cupy as cp

from cuflash import _compile, _dtypes, bench, norm as nm

NBYTES = 256 << 20


def run(name, variants, cases, checked, ref):
    """variants: name -> tuple of -D options; cases: (kind, dtype name, hidden, residual, affine, forced onto the
    cluster path by FWD_CLUSTER_PLAIN_LAYER); checked(plan) -> whether that plan's kernel must carry the options;
    ref: the variant the others are printed against."""
    copy = bench.copy_bandwidth(NBYTES)
    get_kernel = _compile.get_kernel

    def use(variant, plain):
        opt = variants[variant]
        _compile.get_kernel = lambda src, kname, extra=(): get_kernel(src, kname, tuple(extra) + opt)
        nm._FWD_CFG.clear()
        nm.FWD_CLUSTER_PLAIN_LAYER = plain

    out = []
    for kind, dname, hidden, res, affine, plain in cases:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (hidden * dt.itemsize)
        x = (cp.random.standard_normal((rows, hidden), dtype=cp.float32) * 2 + 1).astype(dt)
        r = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt) if res else None
        w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine else None
        b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine and kind == "layer" \
            else None
        sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
        h64 = x[sel].astype(cp.float64) if r is None else (
            x[sel].astype(cp.float32) + r[sel].astype(cp.float32)).astype(dt).astype(cp.float64)
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
            for v in variants:
                use(v, plain)
                pl = nm._fwd_config(nm.LAYER if kind == "layer" else nm.RMS, x.dtype, x.dtype, hidden, res,
                                    x.device.id, affine=affine)
                if checked(pl):
                    opts = [key[2] for key, k in _compile._KERNELS.items() if k is pl.kern]
                    assert len(opts) == 1 and all(o in opts[0] for o in variants[v]), (v, opts)
                path[v] = "stream" if pl.stream else f"cluster{pl.cluster}/{pl.smem >> 10}K" if pl.cluster \
                    else "registers"
                if rnd == 0:
                    o = call()
                    y = o[0] if isinstance(o, tuple) else o
                    err[v] = float(cp.abs(y[sel].astype(cp.float64) - y64).max())
                    del o, y
                ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
                f = nbytes / (ms * 1e-3) / 1e9 / copy
                out.append(dict(round=rnd, variant=v, kind=kind, residual=res, affine=affine, forced=plain,
                                dtype=dname, hidden=hidden, ms=ms, frac_of_copy=f, path=path[v], max_abs_err=err[v]))
                fr.setdefault(v, []).append(f)
        print(kind, "res" if res else "   ", "aff" if affine else "   ", dname, hidden, " | ".join(
            f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v]) for v in variants),
              "|", " ".join(f"{v}/{ref} x%.3f" % (max(fr[v]) / max(fr[ref])) for v in variants if v != ref),
              "| err", {v: "%.2g" % e for v, e in err.items()}, flush=True)
        del x, r
    _compile.get_kernel = get_kernel
    nm.FWD_CLUSTER_PLAIN_LAYER = False
    bench.write_results(f"{name}_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out,
                        {"copy_GBps": copy})
