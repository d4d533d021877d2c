"""Same-run A/B of the cluster forward's LayerNorm statistics (one pass about a shift, warps merged by two sums)
against main's tree: run this in both trees, interleaved (experiments/scratch/ln_shift_call.sh). One run times
every case once (CUDA events, 3 warm-up calls, median of 30, 256 MiB of x) with the 1 GiB copy of the same run,
and the max abs error of y (and of rstd, relative) against float64 on 256 sampled rows.

    PYTHONPATH=. python experiments/scratch/ln_shift_ab.py NAME
Cases: (kind, dtype, hidden, weight and bias, residual, row pattern, planner override). "forced": plain LayerNorm
with weight and bias on the cluster path (norm.FWD_CLUSTER_LAYER_AFFINE = 4). Patterns: "normal" (mean 0, std 1),
"offset" (mean 3), "outlier" (every 16-byte vector's first value 30, so every warp's shift sample is off: the
two-pass fallback everywhere)."""
import os
import sys

import cupy as cp
import numpy as np

from cuflash import _dtypes, bench, norm as nm

NBYTES = 256 << 20
CASES = [
    ("layer", "bfloat16", 16384, True, False, "normal", None),
    ("layer", "bfloat16", 16384, True, False, "normal", "forced"),
    ("layer", "bfloat16", 32768, True, False, "normal", None),
    ("layer", "bfloat16", 32768, True, False, "normal", "forced"),
    ("layer", "float32", 8192, True, False, "normal", "forced"),
    ("layer", "float32", 16384, True, False, "normal", None),
    ("layer", "float32", 16384, True, False, "normal", "forced"),
    ("layer", "float32", 32768, True, False, "normal", None),
    ("layer", "bfloat16", 16384, False, False, "normal", None),
    ("layer", "bfloat16", 32768, False, False, "normal", None),
    ("layer", "float32", 16384, False, False, "normal", None),
    ("layer", "bfloat16", 16384, True, True, "normal", None),
    ("layer", "bfloat16", 32768, True, True, "normal", None),
    ("layer", "float32", 32768, True, True, "normal", None),
    ("layer", "bfloat16", 16384, True, False, "offset", "forced"),
    ("layer", "bfloat16", 16384, True, False, "outlier", "forced"),
    ("layer", "float32", 32768, True, False, "outlier", None),
    ("rms", "bfloat16", 32768, True, False, "normal", None),
]


def main(name):
    copy = bench.copy_bandwidth(1 << 30)
    out = []
    for kind, dname, hidden, affine, res, pattern, force in CASES:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (hidden * dt.itemsize)
        x = cp.random.standard_normal((rows, hidden), dtype=cp.float32)
        if pattern == "offset":
            x += 3
        if pattern == "outlier":
            x[:, ::16 // dt.itemsize] = 30
        x = x.astype(dt)
        r = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt) if res else None
        w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine else None
        b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine else None
        saved = nm.FWD_CLUSTER_LAYER_AFFINE
        if force == "forced":
            nm.FWD_CLUSTER_LAYER_AFFINE = 4
        fn = nm.layer_norm if kind == "layer" else nm.rms_norm
        call = lambda: fn(x, (hidden,), w, *((b,) if kind == "layer" else ()), residual=r,  # noqa: E731
                          return_stats=True)
        pl = nm._fwd_config(nm.LAYER if kind == "layer" else nm.RMS, x.dtype, w.dtype if affine else x.dtype,
                            hidden, res, x.device.id, affine)
        path = "stream" if pl.stream else f"cluster{pl.cluster}{'h' if pl.cap else ''}" if pl.cluster else "registers"
        got = call()
        sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
        h64 = x[sel].astype(cp.float64) + (r[sel].astype(cp.float64) if res else 0)
        if res:
            h64 = got[1][sel].astype(cp.float64)  # the kernel normalises the rounded h it returns
        if kind == "layer":
            m64 = h64.mean(-1, keepdims=True)
            v64 = ((h64 - m64) ** 2).mean(-1, keepdims=True)
        else:
            m64 = 0
            v64 = (h64 ** 2).mean(-1, keepdims=True)
        rs64 = 1 / cp.sqrt(v64 + (1e-5 if kind == "layer" else float(np.finfo(np.float32).eps)))
        y64 = (h64 - m64) * rs64
        if affine:
            y64 = y64 * w.astype(cp.float64) + (b.astype(cp.float64) if kind == "layer" else 0)
        err = float(cp.abs(got[0][sel].astype(cp.float64) - y64).max())
        rstd_err = float((cp.abs(got[-1][sel].astype(cp.float64) - rs64[:, 0]) / rs64[:, 0]).max())
        ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
        nbytes = (2 * NBYTES if not res else 4 * NBYTES)
        f = nbytes / (ms * 1e-3) / 1e9 / copy
        nm.FWD_CLUSTER_LAYER_AFFINE = saved
        row = dict(kind=kind, dtype=dname, hidden=hidden, affine=affine, residual=res, pattern=pattern,
                   force=force or "", path=path, ms=ms, frac_copy=f, max_abs_err=err, rstd_rel_err=rstd_err)
        out.append(row)
        print(f"{kind} {dname} {hidden} aff={int(affine)} res={int(res)} {pattern} {force or '-'} {path}: "
              f"{f:.3f} of copy, err {err:.2g}, rstd rel {rstd_err:.2g}", flush=True)
        del x, r, got
    bench.write_results(name, out, {"copy_GBps": copy})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else f"ln_shift_ab_{os.environ.get('CUFLASH_COMMIT', 'here')}")
