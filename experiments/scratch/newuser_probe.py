#!/usr/bin/env python3
"""A new user's probe of cuflash's softmax family and LayerNorm / RMSNorm, through the public API only.

Run from the repository root on a GPU machine:

    PYTHONPATH=. python experiments/scratch/newuser_probe.py            # every check
    PYTHONPATH=. python experiments/scratch/newuser_probe.py norm_ sm_  # only checks whose name contains one of these
    PYTHONPATH=. python experiments/scratch/newuser_probe.py --list     # the names

Prints ``PASS <check>``, ``FAIL <check>: <details>`` or ``SKIP <check>: <why>`` per check, then a summary; exit
status 1 if any check failed. References: float64 scipy.special / NumPy on host copies of the inputs (as rounded to
their dtype), torch where torch defines the convention (F.layer_norm / F.rms_norm arguments, eps=None).
Environment: PROBE_BUDGET_S (default 90): no new check starts after that many seconds (the rest print SKIP);
PROBE_HARD_S (default 170): a watchdog reports the running check as hung and exits 1. Kernels compile with NVRTC on
first use, so a cold CuPy kernel cache costs most of the time (each line shows its seconds).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import zlib

T0 = time.time()

import numpy as np  # noqa: E402
import ml_dtypes  # noqa: E402
import scipy  # noqa: E402
import scipy.special as ss  # noqa: E402

import cupy as cp  # noqa: E402

import cuflash  # noqa: E402

try:
    import torch
    import torch.nn.functional as TF

    TDEV = os.environ.get("PROBE_TORCH_DEVICE", "cuda")  # "cpu" only for a dry run of this script's own logic
    if TDEV == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA device")
    TORCH_WHY = ""
except Exception as _e:  # torch is optional: its checks print SKIP
    torch = TF = TDEV = None
    TORCH_WHY = f"torch unavailable ({type(_e).__name__}: {_e})"

BUDGET = float(os.environ.get("PROBE_BUDGET_S", "90"))
HARD = float(os.environ.get("PROBE_HARD_S", "170"))

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SM_DTYPES = (F32, F16, BF16, F64)
U32 = 2.0 ** -24  # float32 unit roundoff (the kernels accumulate in float32; float64 input in float64)


from _probe_harness import (Fail, Skip, exc_text, gpu_name, raises_naming,  # noqa: E402  (experiments/scratch)
                            start_watchdog)

# ------------------------------------------------------------------------------------------------------------
# harness
def _exc_text(e):
    return exc_text(e, __file__)


class Check:
    def __init__(self, name):
        self.name = name
        self.fails = []
        self.steps = 0

    @contextlib.contextmanager
    def sub(self, label):
        """One step: a Fail or any exception inside is recorded under ``label`` and the check goes on."""
        self.steps += 1
        try:
            yield
        except Fail as e:
            self.fails.append(f"[{label}] {e}")
        except Skip:
            raise
        except Exception as e:  # a crash of cuflash (or of this script) is a failure of the step
            self.fails.append(f"[{label}] unexpected {_exc_text(e)}")


CHECKS = []


def check(name, torch_needed=False):
    def deco(f):
        CHECKS.append((name, f, torch_needed))
        return f
    return deco


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


# ------------------------------------------------------------------------------------------------------------
# conversions and tolerances
def eps_of(dt):
    return float(ml_dtypes.finfo(np.dtype(dt)).eps)


def unit(dt):
    return 2.0 ** -53 if np.dtype(dt) == F64 else U32


def tiny(dt):
    """Absolute floor: float32/bfloat16 kernels flush subnormal results to zero (-ftz), float16 outputs below its
    smallest subnormal (6e-8) round to 0."""
    return {F64: 1e-300, F32: 1.2e-38, F16: 6e-8, BF16: 1.2e-38}[np.dtype(dt)]


def to_dev(a64, dt):
    with np.errstate(all="ignore"):
        return cp.asarray(np.asarray(a64, np.float64).astype(dt))


def rounded(a64, dt):
    with np.errstate(all="ignore"):
        return np.asarray(a64, np.float64).astype(dt).astype(np.float64)


def host(a):
    """float64 NumPy copy of a CuPy array, torch tensor, NumPy array or scalar."""
    if torch is not None and isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    if isinstance(a, cp.ndarray):
        a = cp.asnumpy(a)
    return np.asarray(a).astype(np.float64)


def desc(a):
    if a is None:
        return "None"
    if isinstance(a, tuple):
        return "(" + ", ".join(desc(x) for x in a) + ")"
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return f"{type(a).__name__}{tuple(a.shape)} {a.dtype}"
    return repr(a)[:80]


def _f(v):
    return f"{float(v):.9g}"


def compare(what, out, ref, rtol=0.0, atol=0.0, scale=None, dtype=None):
    """Elementwise |out - ref| <= atol + rtol * scale (scale defaults to |ref|; rtol, atol, scale broadcast), with
    the NaN, +inf and -inf patterns equal. ``out``: a device/host array; ``ref``: float64. Raises Fail with the
    worst element, max abs/rel errors, shape and dtype."""
    odt = getattr(out, "dtype", None)
    if dtype is not None and (odt is None or str(odt) != str(np.dtype(dtype))):
        raise Fail(f"{what}: dtype {odt}, expected {np.dtype(dtype)} (got {desc(out)})")
    o = host(out)
    r = np.asarray(ref, np.float64)
    if o.shape != r.shape:
        raise Fail(f"{what}: shape {o.shape}, expected {r.shape} (got {desc(out)})")
    for kind, fo, fr in (("NaN", np.isnan(o), np.isnan(r)), ("+inf", o == np.inf, r == np.inf),
                         ("-inf", o == -np.inf, r == -np.inf)):
        bad = fo != fr
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            raise Fail(f"{what}: {kind} pattern differs at {int(bad.sum())} of {o.size} elements, first at {i}: "
                       f"got {_f(o[i])}, expected {_f(r[i])}; shape {o.shape}, dtype {odt}")
    fin = np.isfinite(r)
    with np.errstate(all="ignore"):
        err = np.where(fin, np.abs(o - r), 0.0)
        s = np.abs(r) if scale is None else np.broadcast_to(np.asarray(scale, np.float64), r.shape)
        allowed = np.broadcast_to(np.asarray(atol, np.float64), r.shape) + \
            np.broadcast_to(np.asarray(rtol, np.float64), r.shape) * s
        rel = np.where(fin & (r != 0), err / np.where(r == 0, 1.0, np.abs(r)), 0.0)
    excess = np.where(fin, err - allowed, -np.inf)
    if o.size and float(excess.max()) > 0:
        i = np.unravel_index(int(np.argmax(excess)), r.shape)
        raise Fail(f"{what}: got {_f(o[i])}, expected {_f(r[i])} at {tuple(int(v) for v in i)} (allowed +-"
                   f"{float(allowed[i]):.3g}); max abs err {float(err.max()):.3g}, max rel err {float(rel.max()):.3g},"
                   f" {int((excess > 0).sum())} of {o.size} outside; shape {o.shape}, dtype {odt}")
    return float(err.max(initial=0.0)), float(rel.max(initial=0.0))


def same_bits(what, a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        raise Fail(f"{what}: {desc(a)} vs {desc(b)}")
    ha, hb = cp.asnumpy(a), cp.asnumpy(b)
    ua = np.ascontiguousarray(ha).view(np.uint8).reshape(ha.size, -1) if ha.size else ha
    ub = np.ascontiguousarray(hb).view(np.uint8).reshape(hb.size, -1) if hb.size else hb
    if ha.size and not np.array_equal(ua, ub):
        diff = np.any(ua != ub, axis=1)
        i = int(np.argmax(diff))
        d = np.abs(ha.astype(np.float64).ravel() - hb.astype(np.float64).ravel())
        raise Fail(f"{what}: not bitwise equal: {int(diff.sum())} of {ha.size} elements differ, first at flat "
                   f"index {i} ({_f(ha.ravel()[i])} vs {_f(hb.ravel()[i])}), max abs diff {float(np.nanmax(d)):.3g}; "
                   f"{desc(a)}")


def expect_error(what, exc, words, fn, *args, **kwargs):
    """fn(*args, **kwargs) must raise ``exc`` whose message names every word of ``words`` (_probe_harness)."""
    return raises_naming(what, exc, words, lambda: fn(*args, **kwargs), desc, _exc_text)


def poison(nbytes):
    """Hand the memory pool a block of NaN bytes (0xFF) of this size: an output that reuses it and is not fully
    written shows NaN."""
    p = cp.full(max(int(nbytes), 1), 255, dtype=cp.uint8)
    del p


def sync():
    cp.cuda.Device().synchronize()


def nan_count(a):
    """NaN elements of a device array (bfloat16 through float32)."""
    if a.dtype == BF16:
        a = a.astype(cp.float32)
    return int(cp.isnan(a).sum())


# ------------------------------------------------------------------------------------------------------------
# softmax family references
def _red_axes(ndim, axis):
    if axis is None:
        return tuple(range(ndim))
    ax = axis if isinstance(axis, tuple) else (int(axis),)
    return tuple(a % ndim for a in ax) if ndim else ()


def _red_n(shape, axis):
    if len(shape) == 0:
        return 1
    return int(np.prod([shape[a] for a in _red_axes(len(shape), axis)], dtype=np.int64))


def _absmax(x64, axis, keepdims=True):
    a = np.where(np.isfinite(x64), np.abs(x64), 0.0)
    try:
        return np.max(a, axis=axis, keepdims=keepdims)
    except ValueError:  # an empty reduction
        return np.zeros(np.sum(a, axis=axis, keepdims=keepdims).shape)


def sm_check(what, op, out, x64, axis=None, dt=None, keepdims=False):
    """Compare cuflash's ``op`` output with scipy.special's on x64 (the float64 values of the input). Tolerance:
    one ulp of the output dtype + (4 sqrt(n) + 8) accumulation ulps, plus, for the exponentials, the rounding of
    x - m and of its product with log2(e) (relative (|x| + |m|) 4u)."""
    dt = np.dtype(dt if dt is not None else out.dtype)
    with np.errstate(all="ignore"):
        kw = {"keepdims": keepdims} if op == "logsumexp" else {}
        ref = np.asarray(getattr(ss, op)(x64, axis=axis, **kw), np.float64)
    n = _red_n(x64.shape, axis)
    u, e = unit(dt), eps_of(dt)
    base = e + (4 * math.sqrt(max(n, 1)) + 8) * u
    if op in ("softmax", "log_softmax"):
        xa = np.where(np.isfinite(x64), np.abs(x64), 0.0)
        spread = (xa + _absmax(x64, axis)) * 4 * u
        if op == "softmax":
            return compare(what, out, rounded(ref, dt), rtol=base + spread, atol=tiny(dt), dtype=dt)
        return compare(what, out, rounded(ref, dt), rtol=base, atol=spread, scale=np.maximum(np.abs(ref), 1.0),
                       dtype=dt)
    x1 = np.atleast_1d(x64)  # scipy's logsumexp: atleast_1d
    ma = _absmax(x1, axis, keepdims)
    return compare(what, out, rounded(ref, dt), rtol=base, atol=ma * 4 * u + tiny(dt),
                   scale=np.maximum(np.abs(ref), 1.0), dtype=dt)


def state_ref(x64, axis=-1):
    """(m, l) with the documented conventions: empty / all -inf -> (-inf, 0); +inf -> (+inf, count of +inf)."""
    x = np.atleast_1d(x64)
    shape = np.sum(x, axis=axis).shape
    if x.size == 0 or _red_n(x.shape, axis) == 0:
        return np.full(shape, -np.inf), np.zeros(shape)
    with np.errstate(all="ignore"):
        mk = np.max(x, axis=axis, keepdims=True)
        t = np.exp(x - mk)
        t = np.where(np.isneginf(x), 0.0, t)
        t = np.where((x == np.inf) & (mk == np.inf), 1.0, t)
        return np.max(x, axis=axis), t.sum(axis=axis)


def state_check(what, m, l, x64, axis=-1, dt=None):
    dt = np.dtype(dt)
    acc = F64 if dt == F64 else F32
    rm, rl = state_ref(x64, axis)
    compare(f"{what} m", m, rm, atol=tiny(acc), dtype=acc)  # the max is exact (up to a subnormal flushed to 0)
    n = _red_n(np.atleast_1d(x64).shape, axis)
    rl = np.where(np.isnan(rm), host(l), rl)  # where m is NaN the docs only promise NaN in m ("NaN gives NaN")
    compare(f"{what} l", l, rl, rtol=(4 * math.sqrt(max(n, 1)) + 8) * unit(acc), atol=tiny(acc), dtype=acc)


def run_family(c, label, xd, axis, ops=("softmax", "log_softmax", "logsumexp", "state"), x64=None, **kw):
    x64 = host(xd) if x64 is None else x64
    dt = np.dtype(xd.dtype)
    for op in ops:
        with c.sub(f"{label} {op} axis={axis!r}"):
            if op == "state":
                m, l = cuflash.online_softmax_state(xd, axis=axis, **kw)
                state_check(f"{label} state", m, l, x64, axis, dt)
            else:
                out = getattr(cuflash, op)(xd, axis=axis, **kw)
                sm_check(f"{label} {op}", op, out, x64, axis, dt)


# ------------------------------------------------------------------------------------------------------------
# norm references
def norm_ref(kind, h64, nd, w=None, b=None, eps=1e-5):
    """float64 (y, mean, rstd) over the last ``nd`` dims (mean None for RMSNorm)."""
    axes = tuple(range(h64.ndim - nd, h64.ndim))
    sshape = h64.shape[:h64.ndim - nd]
    with np.errstate(all="ignore"):
        if kind == "layer":
            mean = h64.mean(axis=axes, keepdims=True)
            var = ((h64 - mean) ** 2).mean(axis=axes, keepdims=True)
            y = (h64 - mean) / np.sqrt(var + eps)
        else:
            mean = None
            var = (h64 * h64).mean(axis=axes, keepdims=True)
            y = h64 / np.sqrt(var + eps)
        rstd = 1.0 / np.sqrt(var + eps)
        if w is not None:
            y = y * w
        if b is not None:
            y = y + b
    return y, (None if mean is None else mean.reshape(sshape)), rstd.reshape(sshape)


def _stat_b(a, nd):
    return np.asarray(a, np.float64).reshape(np.shape(a) + (1,) * nd)


def y_check(what, y, h64, nd, kind, w=None, b=None, eps=1e-5, dt=None, ref=None):
    """y against the float64 reference: per-row floor (2 ulp(dt) + (8 sqrt(n) + 32) u32) * S, S = max(1, max|h| *
    rstd * max|w|) + max|b| (an ulp of |h| in the mean moves y by ulp * rstd * |w|)."""
    dt = np.dtype(dt if dt is not None else y.dtype)
    r, _, rstd = norm_ref(kind, h64, nd, w, b, eps)
    if ref is not None:
        r = ref
    axes = tuple(range(h64.ndim - nd, h64.ndim))
    n = int(np.prod(h64.shape[h64.ndim - nd:]))
    hmax = np.max(np.where(np.isfinite(h64), np.abs(h64), 0.0), axis=axes, keepdims=True, initial=0.0)
    wmax = 1.0 if w is None else float(np.max(np.where(np.isfinite(w), np.abs(w), 0.0), initial=0.0))
    bmax = 0.0 if b is None else float(np.max(np.where(np.isfinite(b), np.abs(b), 0.0), initial=0.0))
    rs = np.where(np.isfinite(_stat_b(rstd, nd)), _stat_b(rstd, nd), 0.0)
    S = np.maximum(1.0, hmax * rs * wmax) + bmax
    tol = 2 * eps_of(dt) + (8 * math.sqrt(n) + 32) * U32
    return compare(what, y, rounded(r, dt), atol=tol * S + tiny(dt), dtype=dt)


def stats_check(what, kind, h64, nd, outs, eps):
    """outs: (mean, rstd) for LayerNorm, (rstd,) for RMSNorm, float32, shape h.shape[:-nd]."""
    _, mean, rstd = norm_ref(kind, h64, nd, eps=eps)
    n = int(np.prod(h64.shape[h64.ndim - nd:]))
    tol = (8 * math.sqrt(n) + 32) * U32
    if kind == "layer":
        with np.errstate(all="ignore"):
            std = 1.0 / rstd
        compare(f"{what} mean", outs[0], mean, atol=tol * (np.abs(mean) + np.where(np.isfinite(std), std, 0)),
                dtype=F32)
        cond = np.maximum(1.0, np.where(np.isfinite(mean * rstd), np.abs(mean * rstd), 1.0))
        compare(f"{what} rstd", outs[1], rstd, rtol=tol * cond, atol=1e-30, dtype=F32)
    else:
        compare(f"{what} rstd", outs[0], rstd, rtol=tol, atol=1e-30, dtype=F32)


def bwd_ref(kind, dy64, x64, w64, mean64, rstd64, nd):
    """float64 (dx, dw, db, scales) of y = norm(x) (* w) given the statistics; flattened to (rows, hidden)."""
    shape = x64.shape
    hidden = int(np.prod(shape[len(shape) - nd:]))
    rows = int(np.prod(shape[:len(shape) - nd]))
    x = x64.reshape(rows, hidden)
    dy = dy64.reshape(rows, hidden)
    r = np.asarray(rstd64, np.float64).reshape(rows, 1)
    mu = np.asarray(mean64, np.float64).reshape(rows, 1) if kind == "layer" else 0.0
    xhat = (x - mu) * r
    w = np.ones(hidden) if w64 is None else np.asarray(w64, np.float64).reshape(hidden)
    g = dy * w
    c2 = (g * xhat).mean(-1, keepdims=True)
    if kind == "layer":
        c1 = g.mean(-1, keepdims=True)
        dx = r * (g - c1 - xhat * c2)
    else:
        c1 = 0.0
        dx = r * (g - xhat * c2)
    dx_scale = r * (np.abs(g).max(-1, keepdims=True, initial=0.0) + np.abs(c1)
                    + np.abs(xhat).max(-1, keepdims=True, initial=0.0) * np.abs(g * xhat).mean(-1, keepdims=True))
    dw = (dy * xhat).sum(0)
    dw_scale = (np.abs(dy) * (np.abs(xhat) + np.abs(x) * r)).sum(0)
    db = dy.sum(0)
    db_scale = np.abs(dy).sum(0)
    return dx.reshape(shape), dw, db, dx_scale, dw_scale, db_scale, rows, hidden


def bwd_check(what, kind, outs, dy, x, w, mean, rstd, nd):
    """outs: cuflash's (dx, dw, db) / (dx, dw); the rest the device (or host) arrays passed to it."""
    dx, dw = outs[0], outs[1]
    dt = np.dtype(x.dtype)
    wdt = np.dtype(w.dtype) if w is not None else None
    rdx, rdw, rdb, sdx, sdw, sdb, rows, hidden = bwd_ref(kind, host(dy), host(x), None if w is None else host(w),
                                                         None if mean is None else host(mean), host(rstd), nd)
    tol = 2 * eps_of(dt) + (8 * math.sqrt(hidden) + 32) * U32
    compare(f"{what} dx", dx, rounded(rdx, dt), atol=(tol * sdx).reshape(x.shape[:x.ndim - nd] + (1,) * nd)
            + tiny(dt), dtype=dt)
    nshape = tuple(x.shape[x.ndim - nd:])
    tol_c = (8 * math.sqrt(rows) + 32) * U32
    if w is None:
        if dw is not None:
            raise Fail(f"{what}: dweight should be None without weight, got {desc(dw)}")
    else:
        compare(f"{what} dweight", dw, rounded(rdw, wdt).reshape(nshape),
                atol=((2 * eps_of(wdt) + tol_c) * sdw).reshape(nshape) + tiny(wdt), dtype=wdt)
    if kind == "layer":
        db = outs[2]
        bdt = wdt if w is not None else F32
        compare(f"{what} dbias", db, rounded(rdb, bdt).reshape(nshape),
                atol=((2 * eps_of(bdt) + tol_c) * sdb).reshape(nshape) + tiny(bdt), dtype=bdt)


def _norm(kind):
    return cuflash.layer_norm if kind == "layer" else cuflash.rms_norm


def _bwd(kind):
    return cuflash.layer_norm_backward if kind == "layer" else cuflash.rms_norm_backward


def call_bwd(kind, dy, x, w, mean, rstd):
    if kind == "layer":
        return cuflash.layer_norm_backward(dy, x, w, mean, rstd)
    return cuflash.rms_norm_backward(dy, x, w, rstd)


def norm_full(c, label, kind, dt, shape, nd, rng, wdt=None, loc=3.0, scale=2.0, with_bias=True, eps=1e-5,
              backward=True):
    """weight (with zeros and negatives) + bias + residual + return_stats, then the backward with those stats."""
    wdt = np.dtype(wdt or dt)
    nshape = shape[len(shape) - nd:]
    x64 = rounded(rng.standard_normal(shape) * scale + loc, dt)
    r64 = rounded(rng.standard_normal(shape), dt)
    w64 = rng.standard_normal(nshape) * 0.7 + 0.5
    w64.reshape(-1)[::5] = 0.0
    w64 = rounded(w64, wdt)
    b64 = rounded(rng.standard_normal(nshape), wdt) if (kind == "layer" and with_bias) else None
    xd, rd, wd = to_dev(x64, dt), to_dev(r64, dt), to_dev(w64, wdt)
    bd = None if b64 is None else to_dev(b64, wdt)
    outs = None
    with c.sub(f"{label} forward"):
        if kind == "layer":
            outs = cuflash.layer_norm(xd, nshape, wd, bd, eps, residual=rd, return_stats=True)
            y, h, mean, rstd = outs
        else:
            outs = cuflash.rms_norm(xd, nshape, wd, eps, residual=rd, return_stats=True)
            y, h, rstd = outs
            mean = None
        h64 = rounded(x64 + r64, dt)
        compare(f"{label} h", h, h64, rtol=eps_of(dt), atol=tiny(dt), dtype=dt)  # <= 1 ulp (float32 add, then round)
        h64 = host(h)
        y_check(f"{label} y", y, h64, nd, kind, w64, b64, eps, dt)
        stats_check(f"{label} stats", kind, h64, nd, (mean, rstd) if kind == "layer" else (rstd,), eps)
    if backward and outs is not None:
        with c.sub(f"{label} backward"):
            dy = to_dev(rng.standard_normal(shape), dt)
            bwd_check(f"{label} bwd", kind, call_bwd(kind, dy, h, wd, mean, rstd), dy, h, wd, mean, rstd, nd)
    return outs


# ------------------------------------------------------------------------------------------------------------
# README, verbatim
@check("readme_api_tour_softmax")
def _(c):
    x = cp.random.standard_normal((4096, 50_000), dtype=cp.float32)
    y = cuflash.softmax(x, axis=-1)                 # scipy.special.softmax semantics, any axis / strides
    lse = cuflash.logsumexp(x, axis=-1)             # also b=, keepdims=, return_sign= as scipy
    m, l = cuflash.online_softmax_state(x[:, :25_000])           # the (m, l) state of the online softmax
    m2, l2 = cuflash.merge_states((m, l), cuflash.online_softmax_state(x[:, 25_000:]))
    with c.sub("README's assert cp.allclose(lse_from_state((m2, l2)), lse)"):
        lsm = cuflash.lse_from_state((m2, l2))
        if not bool(cp.allclose(lsm, lse)):
            raise Fail(f"not allclose: max |diff| {float(cp.abs(lsm - lse).max()):.3g}; {desc(lsm)} vs {desc(lse)}")
    rows = [0, 1, 2047, 4095]
    xs = host(x[rows])
    with c.sub("softmax rows vs scipy"):
        sm_check("y", "softmax", y[rows], xs, -1, F32)
    with c.sub("log_softmax rows vs scipy"):
        sm_check("log_softmax", "log_softmax", cuflash.log_softmax(x[rows], axis=-1), xs, -1, F32)
    with c.sub("logsumexp vs scipy"):
        sm_check("lse", "logsumexp", lse[rows], xs, -1, F32)
    with c.sub("merged state vs scipy"):
        state_check("merged", m2[rows], l2[rows], xs, -1, F32)
    del x, y


@check("readme_api_tour_layer_norm")
def _(c):
    h = cp.random.standard_normal((8192, 4096), dtype=cp.float32).astype(cuflash.bfloat16)
    r = cp.random.standard_normal(h.shape, dtype=cp.float32).astype(cuflash.bfloat16)
    w = cp.ones(4096, cp.float32)
    y, h_new, mean, rstd = cuflash.layer_norm(h, (4096,), w, None, residual=r, return_stats=True)  # one pass
    dx, dw, db = cuflash.layer_norm_backward(cp.ones_like(y), h_new, w, mean, rstd)
    rows = [0, 1, 4095, 8191]
    with c.sub("h_new = round(h + r)"):
        compare("h_new", h_new[rows], rounded(host(h[rows]) + host(r[rows]), BF16), rtol=eps_of(BF16), dtype=BF16)
    hs = host(h_new[rows])
    with c.sub("y rows vs float64"):
        y_check("y", y[rows], hs, 1, "layer", None, None, 1e-5, BF16)
    with c.sub("stats rows vs float64"):
        stats_check("stats", "layer", hs, 1, (mean[rows], rstd[rows]), 1e-5)
    with c.sub("dx rows vs float64"):
        rdx, _, _, sdx, _, _, _, _ = bwd_ref("layer", np.ones_like(hs), hs, None, host(mean[rows]), host(rstd[rows]), 1)
        compare("dx", dx[rows], rounded(rdx, BF16), atol=(2 * eps_of(BF16) + 600 * U32) * sdx, dtype=BF16)
    with c.sub("dbias == 8192 (sum of ones over 8192 rows)"):
        compare("db", db, np.full(4096, 8192.0), dtype=F32)
    with c.sub("dweight vs float64 (CuPy float64 column sums)"):
        xh = (h_new.astype(cp.float64) - mean.astype(cp.float64)[:, None]) * rstd.astype(cp.float64)[:, None]
        rdw = cp.asnumpy(xh.sum(0))
        sdw = cp.asnumpy(cp.abs(xh).sum(0) + (cp.abs(h_new.astype(cp.float64)) * rstd.astype(cp.float64)[:, None]).sum(0))
        del xh
        compare("dw", dw, rdw, atol=(2 * eps_of(F32) + (8 * math.sqrt(8192) + 32) * U32) * sdw, dtype=F32)
    with c.sub("dx shape/dtype"):
        if dx.shape != h.shape or dx.dtype != BF16:
            raise Fail(f"dx {desc(dx)}, expected {desc(h)}")


# ------------------------------------------------------------------------------------------------------------
# bad input (cheap: nothing to compile)
@check("sm_bad_inputs_raise_clear_errors")
def _(c):
    x = cp.zeros((4, 6), cp.float32)
    fams = (("softmax", cuflash.softmax), ("log_softmax", cuflash.log_softmax), ("logsumexp", cuflash.logsumexp),
            ("online_softmax_state", cuflash.online_softmax_state))
    for name, f in fams:
        for dt, word in ((cp.int32, "int32"), (cp.int64, "int64"), (cp.uint8, "uint8"), (cp.bool_, "bool"),
                         (cp.complex64, "complex64"), (cp.complex128, "complex128")):
            with c.sub(f"{name}({word})"):
                expect_error(f"{name} {word}", TypeError, ["dtype", word], f, cp.zeros((2, 3), dt))
        with c.sub(f"{name}(numpy)"):
            expect_error(f"{name} numpy", TypeError, ["CuPy|GPU"], f, np.zeros((2, 3), np.float32))
        with c.sub(f"{name}(list)"):
            expect_error(f"{name} list", TypeError, ["CuPy|array"], f, [1.0, 2.0])
        with c.sub(f"{name}(None)"):
            expect_error(f"{name} None", TypeError, ["CuPy|array"], f, None)
        for axis, exc, words in ((2, ValueError, ["axis", "bounds|range"]), (-3, ValueError, ["axis"]),
                                 ((0, 0), ValueError, ["duplicate|repeated"]), ((0, -2), ValueError, ["duplicate|repeated"]),
                                 (1.5, TypeError, ["axis"]), (True, TypeError, ["axis"]), ([0], TypeError, ["axis"]),
                                 ("0", TypeError, ["axis"])):
            with c.sub(f"{name}(axis={axis!r})"):
                expect_error(f"{name} axis={axis!r}", exc, words, f, x, axis=axis)
        with c.sub(f"{name}(method='fast')"):
            expect_error(f"{name} method", ValueError, ["method", "fast"], f, x, method="fast")
        with c.sub(f"{name}(method=None)"):
            expect_error(f"{name} method None", ValueError, ["method"], f, x, method=None)
    for name, f in fams[:2]:
        with c.sub(f"{name} over an empty axis"):
            expect_error(f"{name} empty", ValueError, ["zero-size|empty"], f, cp.zeros((3, 0), cp.float32), axis=-1)
    lse = cuflash.logsumexp
    with c.sub("b complex array"):
        expect_error("b complex", TypeError, ["b", "complex|real"], lse, x, b=cp.ones((4, 6), cp.complex64))
    with c.sub("b host array"):
        expect_error("b numpy", TypeError, ["b", "CuPy|GPU|host"], lse, x, b=np.ones((4, 6), np.float32))
    with c.sub("b shape"):
        expect_error("b shape", ValueError, ["b", "broadcast"], lse, x, b=cp.ones((4,), cp.float32))
    with c.sub("b=True"):
        expect_error("b bool", TypeError, ["b"], lse, x, b=True)
    with c.sub("b=1j"):
        expect_error("b complex scalar", TypeError, ["b"], lse, x, b=1j)
    with c.sub("b list"):
        expect_error("b list", TypeError, ["b"], lse, x, b=[1.0] * 6)
    with c.sub("a bfloat16, b float16"):
        expect_error("b f16 with bf16 a", TypeError, ["bfloat16", "float16"], lse, x.astype(BF16),
                     b=cp.ones(6, cp.float16))
    with c.sub("a bfloat16, b int64 (documented: b of any real dtype): a result or a TypeError naming both"):
        try:
            out = lse(x.astype(BF16), b=cp.arange(6, dtype=cp.int64))
        except TypeError as e:
            if not ("bfloat16" in str(e) and "int64" in str(e)):
                raise Fail(f"TypeError not naming both dtypes: {e!r}")
        else:
            compare("bf16 a, int64 b", out, ss.logsumexp(np.zeros((4, 6)), b=np.arange(6)), rtol=1e-2)
    with c.sub("b with bad method"):
        expect_error("b + method", ValueError, ["method"], lse, x, b=2.0, method="nope")
    with c.sub("b with axis out of range"):
        expect_error("b + axis", ValueError, ["axis"], lse, x, axis=5, b=2.0)
    ms = cuflash.merge_states
    s = (cp.zeros(3, cp.float32), cp.ones(3, cp.float32))
    for lab, a, b, exc, words in (("dict", {"m": 0, "l": 1}, s, TypeError, ["pair"]),
                                  ("3-tuple", s + (s[0],), s, TypeError, ["pair"]),
                                  ("one array", s[0], s, TypeError, ["pair"]),
                                  ("numpy arrays", (np.zeros(3, np.float32), np.ones(3, np.float32)), s, TypeError,
                                   ["CuPy|GPU|host"]),
                                  ("float16 arrays", (s[0].astype(cp.float16), s[1].astype(cp.float16)), s, TypeError,
                                   ["float32"]),
                                  ("bool entry", (True, 1.0), s, TypeError, ["state|bool|CuPy"]),
                                  ("shapes", (cp.zeros(4, cp.float32), cp.ones(4, cp.float32)), s, ValueError,
                                   ["broadcast"])):
        with c.sub(f"merge_states {lab}"):
            expect_error(f"merge_states {lab}", exc, words, ms, a, b)
    with c.sub("lse_from_state shapes"):
        expect_error("lse_from_state shapes", ValueError, ["shape"], cuflash.lse_from_state,
                     (cp.zeros(3, cp.float32), cp.ones(1, cp.float32)))
    with c.sub("lse_from_state int"):
        expect_error("lse_from_state int", TypeError, ["float32"], cuflash.lse_from_state,
                     (cp.zeros(3, cp.int32), cp.ones(3, cp.int32)))


@check("norm_bad_inputs_raise_clear_errors")
def _(c):
    x = cp.ones((4, 16), cp.float32)
    w = cp.ones(16, cp.float32)
    LN, RMS = cuflash.layer_norm, cuflash.rms_norm
    for fname, f in (("layer_norm", LN), ("rms_norm", RMS)):
        for dt, word in ((cp.int32, "int32"), (cp.float64, "float64"), (cp.complex64, "complex64"), (cp.bool_, "bool"),
                         (cp.uint8, "uint8")):
            with c.sub(f"{fname} x {word}"):
                expect_error(f"{fname} x {word}", TypeError, ["dtype", word], f, cp.ones((4, 16), dt), 16)
        with c.sub(f"{fname} x numpy"):
            expect_error(f"{fname} numpy", TypeError, ["CuPy|GPU|host"], f, np.ones((4, 16), np.float32), 16)
        for ns, exc, words in ((None, TypeError, ["normalized_shape"]), ("16", TypeError, ["normalized_shape"]),
                               (16.0, TypeError, ["normalized_shape"]), ((16.0,), TypeError, ["normalized_shape"]),
                               (True, TypeError, ["normalized_shape"]), ((8,), ValueError, ["trailing|normalized_shape"]),
                               ((), ValueError, ["normalized_shape"]), ((-16,), ValueError, ["normalized_shape"]),
                               ((4, 4, 16), ValueError, ["trailing|normalized_shape"])):
            with c.sub(f"{fname} normalized_shape={ns!r}"):
                expect_error(f"{fname} ns={ns!r}", exc, words, f, x, ns)
        with c.sub(f"{fname} weight shape"):
            expect_error(f"{fname} weight shape", ValueError, ["weight", "15"], f, x, 16, cp.ones(15, cp.float32))
        with c.sub(f"{fname} weight (1, 16)"):
            expect_error(f"{fname} weight (1,16)", ValueError, ["weight"], f, x, 16, cp.ones((1, 16), cp.float32))
        with c.sub(f"{fname} weight float64"):
            expect_error(f"{fname} weight f64", TypeError, ["weight", "float64"], f, x, 16, cp.ones(16, cp.float64))
        with c.sub(f"{fname} weight int32"):
            expect_error(f"{fname} weight i32", TypeError, ["weight", "int32"], f, x, 16, cp.ones(16, cp.int32))
        with c.sub(f"{fname} weight float16 with bfloat16 x"):
            expect_error(f"{fname} weight f16/bf16", TypeError, ["weight", "float16"], f, x.astype(BF16), 16,
                         cp.ones(16, cp.float16))
        with c.sub(f"{fname} weight numpy"):
            expect_error(f"{fname} weight numpy", TypeError, ["weight"], f, x, 16, np.ones(16, np.float32))
        with c.sub(f"{fname} residual shape"):
            expect_error(f"{fname} residual shape", ValueError, ["residual"], f, x, 16, residual=cp.ones((4, 15), cp.float32))
        with c.sub(f"{fname} residual dtype"):
            expect_error(f"{fname} residual dtype", TypeError, ["residual"], f, x, 16, residual=cp.ones((4, 16), cp.float16))
        with c.sub(f"{fname} residual numpy"):
            expect_error(f"{fname} residual numpy", TypeError, ["residual"], f, x, 16, residual=np.ones((4, 16), np.float32))
        for eps, exc in ((-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError), (1e39, ValueError),
                         ("1e-5", TypeError), (True, TypeError), (1e-5j, TypeError)):
            with c.sub(f"{fname} eps={eps!r}"):
                expect_error(f"{fname} eps={eps!r}", exc, ["eps"], f, x, 16, None, **({"eps": eps}))
        for rs in ("yes", 2, None):
            with c.sub(f"{fname} return_stats={rs!r}"):
                expect_error(f"{fname} return_stats={rs!r}", TypeError, ["return_stats"], f, x, 16, return_stats=rs)
    with c.sub("layer_norm weight/bias dtypes differ"):
        expect_error("w/b dtypes", TypeError, ["same dtype|bias"], LN, x.astype(cp.float16), 16,
                     cp.ones(16, cp.float16), cp.ones(16, cp.float32))
    with c.sub("rms_norm(x, n, w, b) with b an array in eps's place"):
        expect_error("rms 4th positional", TypeError, ["eps"], RMS, x, 16, w, cp.zeros(16, cp.float32))
    with c.sub("rms_norm bias= keyword"):
        expect_error("rms bias kw", TypeError, ["bias"], RMS, x, 16, w, bias=cp.zeros(16, cp.float32))
    rs = cp.ones(4, cp.float32)
    LB, RB = cuflash.layer_norm_backward, cuflash.rms_norm_backward
    for lab, f, args, exc, words in (
            ("dy shape", LB, (cp.ones((4, 15), cp.float32), x, None, rs, rs), ValueError, ["dy"]),
            ("dy dtype", RB, (cp.ones((4, 16), cp.float16), x, None, rs), TypeError, ["dy"]),
            ("mean None", LB, (x, x, None, None, rs), TypeError, ["mean"]),
            ("mean float64", LB, (x, x, None, cp.ones(4, cp.float64), rs), TypeError, ["mean", "float64"]),
            ("mean shape", LB, (x, x, None, cp.ones(3, cp.float32), rs), ValueError, ["mean"]),
            ("rstd (4, 1)", RB, (x, x, None, cp.ones((4, 1), cp.float32)), ValueError, ["rstd"]),
            ("rstd (4, 16)", RB, (x, x, None, cp.ones((4, 16), cp.float32)), ValueError, ["rstd"]),
            ("rstd numpy", RB, (x, x, None, np.ones(4, np.float32)), TypeError, ["rstd"]),
            ("rstd float16", RB, (x, x, None, cp.ones(4, cp.float16)), TypeError, ["rstd"]),
            ("weight shape", RB, (x, x, cp.ones(8, cp.float32), rs), ValueError, ["weight"]),
            ("x int32", RB, (cp.ones((4, 16), cp.int32), cp.ones((4, 16), cp.int32), None, rs), TypeError, ["int32"]),
            ("x empty hidden", RB, (cp.ones((4, 0), cp.float32), cp.ones((4, 0), cp.float32), None, rs), ValueError,
             ["element|normalized"])):
        with c.sub(f"backward {lab}"):
            expect_error(f"backward {lab}", exc, words, f, *args)


# ------------------------------------------------------------------------------------------------------------
# softmax family
@check("sm_default_axis_none_as_scipy")
def _(c):
    rng = rng_for(c.name)
    x64 = rounded(rng.standard_normal((5, 7)) * 3, F32)
    xd = to_dev(x64, F32)
    for op in ("softmax", "log_softmax", "logsumexp"):
        with c.sub(f"{op}(x) (axis omitted)"):
            sm_check(op, op, getattr(cuflash, op)(xd), x64, None, F32)
    with c.sub("online_softmax_state(x) defaults to axis=-1"):
        m, l = cuflash.online_softmax_state(xd)
        state_check("state", m, l, x64, -1, F32)


@check("sm_axes_every_dtype")
def _(c):
    rng = rng_for(c.name)
    for dt in SM_DTYPES:
        x64 = rounded(rng.standard_normal((4, 6, 9)) * 4, dt)
        xd = to_dev(x64, dt)
        axes = (-1, 0, 1, -2, (0, 2), (2, 0), (0, 1, 2), (), None) if dt in (F32, BF16) else (-1, (0, 2), None)
        for ax in axes:
            run_family(c, str(dt), xd, ax, x64=x64)
        with c.sub(f"{dt} logsumexp keepdims"):
            out = cuflash.logsumexp(xd, axis=(0, 2), keepdims=True)
            sm_check("lse keepdims", "logsumexp", out, x64, (0, 2), dt, keepdims=True)


@check("sm_axis_argument_types")
def _(c):
    rng = rng_for(c.name)
    x64 = rounded(rng.standard_normal((3, 5)) * 2, F32)
    xd = to_dev(x64, F32)
    for ax, axs in ((np.int64(-1), -1), (np.int32(0), 0), ((np.int64(0), -1), (0, 1)), (np.uint8(1), 1)):
        with c.sub(f"axis={ax!r}"):
            sm_check(f"softmax axis={ax!r}", "softmax", cuflash.softmax(xd, axis=ax), x64, axs, F32)
            sm_check(f"logsumexp axis={ax!r}", "logsumexp", cuflash.logsumexp(xd, axis=ax), x64, axs, F32)
    with c.sub("axis=np.array(1) (0-d; scipy accepts it)"):
        try:
            out = cuflash.softmax(xd, axis=np.array(1))
        except TypeError as e:
            if "axis" not in str(e).lower():
                raise Fail(f"TypeError whose message does not name the axis: {e!r}")
        else:
            sm_check("softmax axis=array(1)", "softmax", out, x64, 1, F32)


@check("sm_noncontiguous_views")
def _(c):
    rng = rng_for(c.name)
    for dt in (F32, BF16, F16):
        base = to_dev(rng.standard_normal((64, 256)) * 3, dt)
        flat = to_dev(rng.standard_normal(3 + 64 * 256) * 3, dt)
        row = to_dev(rng.standard_normal(256) * 3, dt)
        col = to_dev(rng.standard_normal((64, 1)) * 3, dt)
        four = to_dev(rng.standard_normal((3, 4, 5, 6)) * 3, dt)
        it = np.dtype(dt).itemsize
        views = [("T", base.T, (-1, 0)), ("step3", base[:, ::3], (-1, 0)), ("steps2x5", base[::2, 1::5], (-1,)),
                 ("rows reversed", base[::-1], (-1, 0)), ("both reversed", base[::-1, ::-1], (-1, (0, 1))),
                 ("broadcast rows (stride 0)", cp.broadcast_to(row, (100, 256)), (-1, 0)),
                 ("broadcast cols (stride 0)", cp.broadcast_to(col, (64, 300)), (-1, 0)),
                 ("fortran", cp.asfortranarray(base), (-1, 0)),
                 ("offset 1 element", flat[1:1 + 64 * 256].reshape(64, 256), (-1,)),
                 ("offset 3, rows of 255", flat[3:3 + 64 * 255].reshape(64, 255), (-1,)),
                 ("overlapping rows", cp.lib.stride_tricks.as_strided(flat, shape=(50, 64), strides=(8 * it, it)),
                  (-1, 0)),
                 ("4-d permuted", four.transpose(2, 0, 3, 1), ((1, 3), (0, -1), 2))]
        for lab, v, axes in views:
            x64 = host(v)
            for ax in axes:
                run_family(c, f"{dt} {lab}", v, ax, x64=x64)


@check("sm_0d_empty_one_element")
def _(c):
    z = to_dev(np.array(2.5), F32)
    for ax in (None, 0, -1, ()):
        for op in ("softmax", "log_softmax", "logsumexp"):
            with c.sub(f"0-d {op} axis={ax!r}"):
                try:
                    with np.errstate(all="ignore"):
                        getattr(ss, op)(np.array(2.5), axis=ax)
                    scipy_ok = True
                except Exception as e:
                    scipy_ok, sexc = False, e
                if scipy_ok:
                    out = getattr(cuflash, op)(z, axis=ax)
                    sm_check(f"0-d {op}", op, out, np.array(2.5), ax, F32)
                else:  # scipy refuses: cuflash should refuse with the same kind of error
                    expect_error(f"0-d {op} axis={ax!r} (scipy: {_exc_text(sexc)})",
                                 ValueError if isinstance(sexc, ValueError) else type(sexc), [], getattr(cuflash, op),
                                 z, axis=ax)
    with c.sub("0-d state"):
        m, l = cuflash.online_softmax_state(z)
        state_check("0-d state", m, l, np.array(2.5), -1, F32)
    with c.sub("0-d logsumexp keepdims / return_sign"):
        out = cuflash.logsumexp(z, keepdims=True)
        ref = ss.logsumexp(np.array(2.5), keepdims=True)
        compare("0-d lse keepdims", out, ref, rtol=1e-6, dtype=F32)
        o, s = cuflash.logsumexp(z, return_sign=True)
        compare("0-d lse sign", s, np.float64(1.0), dtype=F32)
    for v in (np.inf, -np.inf, np.nan):
        with c.sub(f"0-d {v}"):
            zz = to_dev(np.array(v), F32)
            for op in ("softmax", "log_softmax", "logsumexp"):
                sm_check(f"0-d {v} {op}", op, getattr(cuflash, op)(zz), np.array(v), None, F32)
    e05 = cp.zeros((0, 5), cp.float32)
    e50 = cp.zeros((5, 0), cp.float32)
    with c.sub("(0, 5) axis -1"):
        for op in ("softmax", "log_softmax", "logsumexp"):
            sm_check(f"(0,5) {op}", op, getattr(cuflash, op)(e05, axis=-1), np.zeros((0, 5)), -1, F32)
        m, l = cuflash.online_softmax_state(e05)
        state_check("(0,5) state", m, l, np.zeros((0, 5)), -1, F32)
    with c.sub("(5, 0) axis 0 (scipy: empty result, no error)"):
        for op in ("softmax", "log_softmax"):
            sm_check(f"(5,0) axis0 {op}", op, getattr(cuflash, op)(e50, axis=0), np.zeros((5, 0)), 0, F32)
    with c.sub("(5, 0) axis -1 logsumexp / state / sign"):
        sm_check("(5,0) lse", "logsumexp", cuflash.logsumexp(e50, axis=-1), np.zeros((5, 0)), -1, F32)
        o, s = cuflash.logsumexp(e50, axis=-1, return_sign=True)
        ro, rs_ = ss.logsumexp(np.zeros((5, 0)), axis=-1, return_sign=True)
        compare("(5,0) sign", s, rs_, dtype=F32)
        out = cuflash.logsumexp(e50, axis=-1, keepdims=True)
        if out.shape != (5, 1):
            raise Fail(f"keepdims shape {out.shape}, expected (5, 1)")
        m, l = cuflash.online_softmax_state(e50)
        state_check("(5,0) state", m, l, np.zeros((5, 0)), -1, F32)
    with c.sub("(0,) softmax raises like scipy; logsumexp -inf"):
        expect_error("softmax (0,)", ValueError, [], cuflash.softmax, cp.zeros(0, cp.float32))
        sm_check("(0,) lse", "logsumexp", cuflash.logsumexp(cp.zeros(0, cp.float32)), np.zeros(0), None, F32)
    with c.sub("(2, 0) logsumexp axis=None -> -inf (documented deviation)"):
        compare("(2,0) lse", cuflash.logsumexp(cp.zeros((2, 0), cp.float32)), np.float64(-np.inf), dtype=F32)
    for shape, ax in (((1,), -1), ((1,), None), ((1, 1), 0), ((1, 1), None), ((1, 1, 1), (0, 2)), ((7, 1), -1),
                      ((1, 7), 0)):
        with c.sub(f"one element per reduction {shape} axis={ax!r}"):
            x64 = rounded(np.arange(np.prod(shape)).reshape(shape) * 1.5 - 2, F32)
            run_family(c, f"{shape}", to_dev(x64, F32), ax, x64=x64)


EDGE_ROWS = [
    [0.0, -np.inf, 1.0, 2.0, -np.inf, 3.0],
    [-np.inf] * 6,
    [np.inf, 0.0, 1.0, 2.0, 3.0, 4.0],
    [0.0, 1.0, 2.0, 3.0, 4.0, np.inf],
    [np.inf, np.inf, 0.0, 1.0, -np.inf, 2.0],
    [np.nan, 0.0, 1.0, 2.0, 3.0, 4.0],
    [0.0, 1.0, 2.0, 3.0, 4.0, np.nan],
    [np.nan, np.inf, -np.inf, 0.0, 1.0, 2.0],
    [5.0] * 6,
    [-1e30] * 6,
    [3e38, -3e38, 0.0, 1.0, 2.0, 3.0],
    [1e-38, 2e-38, 0.0, -1e-38, 0.0, 0.0],
    [1e-39, 0.0, -1e-39, 3e-45, 0.0, -3e-45],  # float32 subnormals (the kernels flush them: -ftz=true)
    [60000.0, -60000.0, 65504.0, -65504.0, 0.0, 1.0],
    [-np.inf, -np.inf, -np.inf, -np.inf, -np.inf, 7.0],
    [1000.0, 999.0, 0.0, -1000.0, 1024.0, 1023.0],
    [-1030.0, -1040.0, -1050.0, -1060.0, -1070.0, -1080.0],
    [1e300, -1e300, 0.0, 1.0, 2.0, 3.0],
]


@check("sm_edge_values_short_and_long_rows")
def _(c):
    E = np.array(EDGE_ROWS)
    for dt in SM_DTYPES:
        x64 = rounded(E, dt)
        xd = to_dev(E, dt)
        run_family(c, f"{dt} short", xd, -1, x64=x64)
        with c.sub(f"{dt} short return_sign vs scipy"):
            o, s = cuflash.logsumexp(xd, axis=-1, return_sign=True)
            with np.errstate(all="ignore"):
                ro, rs_ = ss.logsumexp(x64, axis=-1, return_sign=True)
            compare("sign", s, rs_, dtype=dt)
        with c.sub(f"{dt} short lse_from_state == logsumexp"):
            st = cuflash.online_softmax_state(xd)
            b = host(cuflash.logsumexp(xd, axis=-1))
            compare("lse_from_state", cuflash.lse_from_state(st), b, rtol=8 * eps_of(dt), atol=1e-30)
        if dt in (F32, BF16):
            # each edge row spread over a long row (positions 0, 1, n/2, n/2 + 1, n - 2, n - 1), -inf elsewhere:
            # the long-row paths must keep the same edge semantics
            n = 70001 if dt == F32 else 140001
            L = np.full((len(EDGE_ROWS), n), -np.inf)
            pos = [0, 1, n // 2, n // 2 + 1, n - 2, n - 1]
            L[:, pos] = E
            L64 = rounded(L, dt)
            run_family(c, f"{dt} long n={n}", to_dev(L, dt), -1, x64=L64)


@check("sm_logsumexp_b_weights_and_return_sign")
def _(c):
    rng = rng_for(c.name)
    a64 = rounded(rng.standard_normal((4, 9)) * 3, F32)
    ad = to_dev(a64, F32)
    bpos = rng.uniform(0.1, 2.0, (4, 9))
    bneg = rng.standard_normal((4, 9))
    bz = bpos.copy()
    bz[0] = 0.0
    ainf = a64.copy()
    ainf[1, :3] = np.inf
    bdrop = bpos.copy()
    bdrop[1, :3] = 0.0  # +inf entries with zero weight are dropped (scipy)
    cases = [("b>0", ad, a64, bpos, {}), ("b>0 return_sign", ad, a64, bpos, {"return_sign": True}),
             ("b mixed sign, return_sign", ad, a64, bneg, {"return_sign": True}),
             ("b mixed sign, no return_sign (NaN where negative)", ad, a64, bneg, {}),
             ("b zero row", ad, a64, bz, {"return_sign": True}),
             ("b zero at +inf", to_dev(ainf, F32), ainf, bdrop, {}),
             ("b row vector", ad, a64, bpos[0], {}), ("b column", ad, a64, bpos[:, :1], {}),
             ("b>0 axis=0 keepdims", ad, a64, bpos, {"axis": 0, "keepdims": True}),
             ("b>0 axis=None", ad, a64, bpos, {"axis": None}),
             ("b>0 axis=(0,1)", ad, a64, bpos, {"axis": (0, 1)}),
             ("a (4,1) b (1,9) broadcast", to_dev(a64[:, :1], F32), a64[:, :1], bpos[:1], {"axis": -1}),
             ("b int64", ad, a64, np.arange(9, dtype=np.int64) - 3, {"return_sign": True}),
             ("b bool", ad, a64, (np.arange(36).reshape(4, 9) % 3 == 0), {}),
             ("b float64", ad, a64, bpos.astype(np.float64), {}),
             ("a float16, b int64", to_dev(a64, F16), rounded(a64, F16), np.arange(1, 10, dtype=np.int64), {}),
             ("a float64, b float32", to_dev(a64, F64), a64, bpos.astype(np.float32), {"return_sign": True})]
    for sc in (2.0, -1.0, 0.0, np.float64(2.0), np.float32(0.5), 3):
        cases.append((f"b scalar {sc!r}", ad, a64, sc, {"return_sign": True} if float(sc) <= 0 else {}))
    for lab, a, a_h, b, kw in cases:
        with c.sub(lab):
            kw = dict(kw)
            axis = kw.pop("axis", -1)
            bd = cp.asarray(b) if isinstance(b, np.ndarray) else b
            got = cuflash.logsumexp(a, axis=axis, b=bd, **kw)
            a_same = np.asarray(host(a)).astype(a.dtype)  # scipy on the same dtypes: the dtype to expect
            with np.errstate(all="ignore"):
                want_dt = ss.logsumexp(a_same, axis=axis, b=b, **kw)
                want = ss.logsumexp(a_h, axis=axis, b=np.asarray(b, np.float64), **kw)
            gots = got if kw.get("return_sign") else (got,)
            wants = want if kw.get("return_sign") else (want,)
            wdts = want_dt if kw.get("return_sign") else (want_dt,)
            # conditioning of the weighted sum: sum|b e^(a-max)| / |sum b e^(a-max)|
            with np.errstate(all="ignore"):
                A, B = np.broadcast_arrays(a_h, np.asarray(b, np.float64))
                ax = _red_axes(A.ndim, axis)
                am = np.max(np.where(B != 0, A, -np.inf), axis=ax, keepdims=True)
                t = np.where(B != 0, B * np.exp(A - am), 0.0)
                cond = np.abs(t).sum(axis=ax, keepdims=kw.get("keepdims", False)) / \
                    np.abs(t.sum(axis=ax, keepdims=kw.get("keepdims", False)))
                cond = np.where(np.isfinite(cond), cond, 1.0)
            # the docstring's dtype rule: numpy.result_type(a, b) (a Python scalar b keeps a.dtype; integer / bool
            # weights give float64 unless the result is already a float)
            if isinstance(b, np.ndarray):
                doc_dt = np.result_type(a.dtype, b.dtype)
                doc_dt = doc_dt if doc_dt.kind == "f" else np.dtype(np.float64)
            else:
                doc_dt = np.result_type(a.dtype, b)
            for i, (g, w, wd) in enumerate(zip(gots, wants, wdts)):
                what = f"{lab} {'lse' if i == 0 else 'sign'}"
                gdt = np.dtype(g.dtype)
                if gdt != doc_dt:
                    raise Fail(f"{what}: dtype {gdt}, the docstring's rule gives {doc_dt} (a {a.dtype}, b "
                               f"{getattr(b, 'dtype', type(b).__name__)})")
                sv = tuple(int(v) for v in scipy.__version__.split(".")[:2])
                if sv >= (1, 15) and str(gdt) != str(np.asarray(wd).dtype):
                    raise Fail(f"{what}: dtype {gdt}, scipy {scipy.__version__} gives {np.asarray(wd).dtype} "
                               f"(a {a.dtype}, b {getattr(b, 'dtype', type(b).__name__)})")
                tol = (eps_of(gdt) + 64 * unit(gdt)) * cond
                compare(what, g, rounded(w, gdt), rtol=0 if i else tol, atol=0 if i else tol,
                        scale=None if i else np.maximum(1.0, np.abs(w)))


@check("sm_methods_safe_naive")
def _(c):
    rng = rng_for(c.name)
    for dt in (F32, BF16, F64):
        x64 = rounded(rng.standard_normal((3, 1000)) * 3, dt)
        xd = to_dev(x64, dt)
        for method in ("safe", "naive", "online"):
            run_family(c, f"{dt} method={method}", xd, -1, ops=("softmax", "log_softmax", "logsumexp"), x64=x64,
                       method=method)
        with c.sub(f"{dt} state method=safe"):
            m, l = cuflash.online_softmax_state(xd, method="safe")
            state_check("safe state", m, l, x64, -1, dt)
        with c.sub(f"{dt} state method=naive: m = 0, l = sum(exp(x))"):
            m, l = cuflash.online_softmax_state(xd, method="naive")
            compare("naive m", m, np.zeros(3))
            compare("naive l", l, np.exp(x64).sum(-1), rtol=(4 * math.sqrt(1000) + 8) * unit(dt) + 3 * 4 * unit(dt))
        with c.sub(f"{dt} method='online' explicit == default, bitwise"):
            same_bits("softmax", cuflash.softmax(xd, axis=-1), cuflash.softmax(xd, axis=-1, method="online"))


@check("sm_state_merge_roundtrips")
def _(c):
    rng = rng_for(c.name)
    for dt in (F32, BF16, F64):
        x64 = rng.standard_normal((3, 1000)) * 5
        x64[1, ::7] = -np.inf
        x64[2, 400] = 30.0
        x64 = rounded(x64, dt)
        xd = to_dev(x64, dt)
        cuts = [0, 0, 1, 333, 334, 700, 999, 1000]
        with c.sub(f"{dt} left fold over pieces (empty pieces included)"):
            st = cuflash.online_softmax_state(xd[:, 0:0])
            for a, b in zip(cuts[:-1], cuts[1:]):
                st = cuflash.merge_states(st, cuflash.online_softmax_state(xd[:, a:b]))
            state_check("fold", st[0], st[1], x64, -1, dt)
            sm_check("lse_from_state(fold)", "logsumexp", cuflash.lse_from_state(st), x64, -1, F64 if dt == F64 else F32)
        with c.sub(f"{dt} right fold (merge(b, a))"):
            st = cuflash.online_softmax_state(xd[:, 1000:])
            for a, b in reversed(list(zip(cuts[:-1], cuts[1:]))):
                st = cuflash.merge_states(cuflash.online_softmax_state(xd[:, a:b]), st)
            state_check("rfold", st[0], st[1], x64, -1, dt)
        with c.sub(f"{dt} states over axis=0 pieces"):
            s1 = cuflash.online_softmax_state(xd[:2], axis=0)
            s2 = cuflash.online_softmax_state(xd[2:], axis=0)
            mm = cuflash.merge_states(s1, s2)
            state_check("axis0", mm[0], mm[1], x64, 0, dt)
        with c.sub(f"{dt} state axis=None and tuple"):
            m, l = cuflash.online_softmax_state(xd, axis=None)
            state_check("axis None", m, l, x64, None, dt)
            m, l = cuflash.online_softmax_state(xd, axis=(0, 1))
            state_check("axis (0,1)", m, l, x64, (0, 1), dt)
    f32 = lambda v: cp.asarray(np.asarray(v, np.float32))  # noqa: E731
    with c.sub("+inf / -inf / NaN states"):
        m, l = cuflash.merge_states((f32([np.inf, np.inf, -np.inf, np.nan, 1.0]), f32([1, 2, 0, 1, 1])),
                                    (f32([np.inf, 5.0, -np.inf, 0.0, -np.inf]), f32([2, 1, 0, 1, 0])))
        compare("m", m, np.array([np.inf, np.inf, -np.inf, np.nan, 1.0]), dtype=F32)
        compare("l (non-NaN m)", l[:3], np.array([3.0, 2.0, 0.0]), dtype=F32)
        compare("l (empty merged into (1, 1))", l[4:], np.array([1.0]), dtype=F32)
        compare("lse_from_state", cuflash.lse_from_state((m[:3], l[:3])), np.array([np.inf, np.inf, -np.inf]))
    with c.sub("Python / NumPy scalars"):
        m, l = cuflash.merge_states((0.0, 1.0), (1.0, 1.0))
        compare("scalars m", m, np.float64(1.0), dtype=F32)
        compare("scalars l", l, np.float64(1 + math.exp(-1)), rtol=4e-7, dtype=F32)
        m, l = cuflash.merge_states((np.float64(0.0), 1.0), (f32([1.0, 2.0]), f32([1.0, 1.0])))
        compare("np.float64 m", m, np.array([1.0, 2.0]), dtype=F64)
        compare("np.float64 l", l, np.array([1 + math.exp(-1), 1 + math.exp(-2)]), rtol=1e-6, dtype=F64)
        lse = cuflash.lse_from_state((2.0, 1.0))
        compare("lse_from_state scalars", lse, np.float64(2.0), rtol=1e-7, dtype=F32)
    with c.sub("broadcast (3,1) with (1,4)"):
        ma, la = f32([[0.0], [1.0], [-np.inf]]), f32([[1.0], [2.0], [0.0]])
        mb, lb = f32([[0.0, 1.0, 2.0, -np.inf]]), f32([[1.0, 1.0, 3.0, 0.0]])
        m, l = cuflash.merge_states((ma, la), (mb, lb))
        with np.errstate(all="ignore"):
            A, La, B, Lb = np.broadcast_arrays(host(ma), host(la), host(mb), host(lb))
            M = np.maximum(A, B)
            L = np.where(np.isneginf(A), 0, La * np.exp(A - M)) + np.where(np.isneginf(B), 0, Lb * np.exp(B - M))
        compare("m", m, M, dtype=F32)
        compare("l", l, L, rtol=1e-6, dtype=F32)
        if not (m.flags.c_contiguous and l.flags.c_contiguous):
            raise Fail("merge_states outputs not C-contiguous (documented)")
    with c.sub("more than 65535 x 256 states (grid-stride)"):
        cnt = 65535 * 256 + 4097
        g = cp.random.RandomState(7)
        ma = g.standard_normal(cnt, dtype=cp.float32)
        mb = g.standard_normal(cnt, dtype=cp.float32)
        la = g.uniform(0.5, 2, cnt, dtype=cp.float32)
        lb = g.uniform(0.5, 2, cnt, dtype=cp.float32)
        poison(cnt * 4)
        m, l = cuflash.merge_states((ma, la), (mb, lb))
        if bool(cp.isnan(m).any()) or bool(cp.isnan(l).any()):
            raise Fail(f"NaN in the output: {int(cp.isnan(l).sum())} of {cnt} l unwritten / wrong")
        sel = np.r_[0:1000, cnt - 5000:cnt]
        A, La, B, Lb = (host(v[sel]) for v in (ma, la, mb, lb))
        M = np.maximum(A, B)
        compare("m tail", m[sel], M, dtype=F32)
        compare("l tail", l[sel], La * np.exp(A - M) + Lb * np.exp(B - M), rtol=2e-6, dtype=F32)
        del ma, mb, la, lb, m, l


@check("sm_long_rows_few_rows")
def _(c):
    g = cp.random.RandomState(11)
    for lab, dt, shape in (("float32 2x1M", F32, (2, 1 << 20)), ("bfloat16 2x1M", BF16, (2, 1 << 20)),
                           ("float16 2x(1M+3)", F16, (2, (1 << 20) + 3)), ("float64 2x1M", F64, (2, 1 << 20)),
                           ("float32 1x3M (past the held path's reach)", F32, (1, 3_000_001)),
                           ("float32 1x(1M+1) rows", F32, (1, (1 << 20) + 1))):
        xf = g.standard_normal(shape, dtype=cp.float32) * 4
        if shape[0] > 1:
            xf[1, -1] = 40.0  # the row max in the last element
            xf[0, shape[1] // 3] = -np.inf
        x = xf.astype(dt)
        del xf
        x64 = host(x)
        for op in ("softmax", "log_softmax", "logsumexp", "state"):
            with c.sub(f"{lab} {op}"):
                poison(x.nbytes)
                if op == "state":
                    m, l = cuflash.online_softmax_state(x)
                    state_check(lab, m, l, x64, -1, dt)
                else:
                    sm_check(f"{lab} {op}", op, getattr(cuflash, op)(x, axis=-1), x64, -1, dt)
        if lab.startswith("float32 2x1M"):
            with c.sub(f"{lab} repeated calls bitwise equal"):
                same_bits("softmax", cuflash.softmax(x, axis=-1), cuflash.softmax(x, axis=-1))
                same_bits("logsumexp", cuflash.logsumexp(x, axis=-1), cuflash.logsumexp(x, axis=-1))
        del x


@check("sm_many_short_rows")
def _(c):
    g = cp.random.RandomState(12)
    for lab, dt, shape, axis in (("f32 70001x1", F32, (70001, 1), -1), ("bf16 70001x3", BF16, (70001, 3), -1),
                                 ("f16 100003x7", F16, (100003, 7), -1), ("f32 70001x33", F32, (70001, 33), -1),
                                 ("f32 3x70001 axis 0", F32, (3, 70001), 0), ("f64 70001x5", F64, (70001, 5), -1),
                                 ("f32 300000x2", F32, (300000, 2), -1)):
        x = (g.standard_normal(shape, dtype=cp.float32) * 3).astype(dt)
        x64 = host(x)
        for op in ("softmax", "log_softmax", "logsumexp", "state"):
            with c.sub(f"{lab} {op}"):
                poison(x.nbytes)
                if op == "state":
                    m, l = cuflash.online_softmax_state(x, axis=axis)
                    state_check(lab, m, l, x64, axis, dt)
                else:
                    sm_check(f"{lab} {op}", op, getattr(cuflash, op)(x, axis=axis), x64, axis, dt)


@check("sm_odd_lengths")
def _(c):
    rng = rng_for(c.name)
    for dt in (F32, BF16, F16):
        for n in (1, 3, 7, 65537):
            if dt == F16 and n == 65537:
                continue
            x64 = rounded(rng.standard_normal((3, n)) * 5, dt)
            run_family(c, f"{dt} n={n}", to_dev(x64, dt), -1, x64=x64)


@check("sm_stale_results_same_shape")
def _(c):
    rng = rng_for(c.name)
    for dt in (F32, BF16):
        x1 = rounded(rng.standard_normal((128, 4096)) * 3, dt)
        x2 = rounded(rng.standard_normal((128, 4096)) * 3 + 1, dt)
        d1, d2 = to_dev(x1, dt), to_dev(x2, dt)
        with c.sub(f"{dt} softmax x1 then x2"):
            y1 = cuflash.softmax(d1, axis=-1)
            y2 = cuflash.softmax(d2, axis=-1)
            sm_check("second call", "softmax", y2, x2, -1, dt)
            sm_check("first result after the second call", "softmax", y1, x1, -1, dt)
        with c.sub(f"{dt} logsumexp / state x1 then x2"):
            cuflash.logsumexp(d1, axis=-1)
            sm_check("lse second", "logsumexp", cuflash.logsumexp(d2, axis=-1), x2, -1, dt)
            cuflash.online_softmax_state(d1)
            m, l = cuflash.online_softmax_state(d2)
            state_check("state second", m, l, x2, -1, dt)
        big = to_dev(rng.standard_normal((300, 4096 + 8)) * 3, dt)
        with c.sub(f"{dt} views of one array at several offsets and strides"):
            for v in (big[0:128, :4096], big[100:228, :4096], big[1:129, 8:], big[2:130, 3:4099], d1, big[0:128, :4096]):
                sm_check("view", "softmax", cuflash.softmax(v, axis=-1), host(v), -1, dt)
                sm_check("view", "log_softmax", cuflash.log_softmax(v, axis=-1), host(v), -1, dt)
        with c.sub(f"{dt} in-place update of the input between calls"):
            d = d1.copy()
            cuflash.softmax(d, axis=-1)
            d.view(cp.uint8)[...] = d2.view(cp.uint8)  # new values at the same address
            sm_check("after update", "softmax", cuflash.softmax(d, axis=-1), x2, -1, dt)


@check("sm_nondefault_stream")
def _(c):
    s = cp.cuda.Stream(non_blocking=True)
    sync()
    with s:
        big = cp.random.RandomState(5).standard_normal((4096, 4096), dtype=cp.float32)
        for _ in range(30):  # keep the stream busy, so work launched elsewhere would read x before it is written
            big = cp.sin(big) * 3.0
        x = big[:64, :1000].astype(BF16)
        xl = big[:512].reshape(2, 1 << 20)  # 4 MiB rows: the held path on compute capability 9.0
        y = cuflash.softmax(x, axis=-1)
        ly = cuflash.log_softmax(x, axis=-1)
        lse = cuflash.logsumexp(x, axis=-1)
        m, l = cuflash.online_softmax_state(x)
        mm = cuflash.merge_states((m, l), (m, l))
        lw = cuflash.logsumexp(x, axis=-1, b=cp.full(1000, 0.5, cp.float32))
        yl = cuflash.softmax(xl, axis=-1)
        lsl = cuflash.logsumexp(xl, axis=-1)
    s.synchronize()
    x64, xl64 = host(x), host(xl)
    for lab, out, op, xx in (("softmax", y, "softmax", x64), ("log_softmax", ly, "log_softmax", x64),
                             ("logsumexp", lse, "logsumexp", x64), ("long softmax", yl, "softmax", xl64),
                             ("long logsumexp", lsl, "logsumexp", xl64)):
        with c.sub(lab):
            sm_check(lab, op, out, xx, -1, out.dtype)
    with c.sub("state / merge"):
        state_check("state", m, l, x64, -1, BF16)
        rm, rl = state_ref(x64)
        compare("merged m", mm[0], rm, dtype=F32)
        compare("merged l", mm[1], 2 * rl, rtol=1e-5, dtype=F32)
    with c.sub("logsumexp with b"):
        compare("lse b", lw, ss.logsumexp(x64, axis=-1, b=0.5), rtol=1e-5, atol=1e-5, dtype=F32)


@check("sm_torch_dlpack", torch_needed=True)
def _(c):
    t = torch.randn(64, 1000, device=TDEV) * 3
    for lab, tt, axis in (("float32", t, -1), ("transposed", t.T, 0), ("strided", t[:, ::3], -1),
                          ("float16", t.half(), -1), ("expanded (stride 0)", t[:1].expand(50, 1000), -1)):
        with c.sub(lab):
            out = cuflash.softmax(tt, axis=axis)
            sm_check(lab, "softmax", out, host(tt), axis, np.dtype(out.dtype))
            ref_t = torch.softmax(tt.double(), dim=axis)
            compare(f"{lab} vs torch", out, host(ref_t), rtol=max(4 * eps_of(out.dtype), 2e-5), atol=tiny(out.dtype))
    with c.sub("bfloat16 tensor directly (a result, or a TypeError that says why)"):
        tb = t.bfloat16()
        try:
            out = cuflash.softmax(tb, axis=-1)
        except TypeError as e:
            if not any(w in str(e).lower() for w in ("bfloat16", "dlpack", "dtype", "view")):
                raise Fail(f"TypeError without a reason: {e!r}")
        else:
            sm_check("bf16 torch", "softmax", out, host(tb), -1, np.dtype(out.dtype))
    with c.sub("tensor with requires_grad=True -> TypeError naming the fix"):
        expect_error("requires_grad", TypeError, ["grad|detach"], cuflash.softmax, t.clone().requires_grad_(True), -1)
    with c.sub("CPU tensor -> TypeError (no silent host copy)"):
        expect_error("cpu tensor", TypeError, ["GPU|CUDA|CuPy|host|cpu|device"], cuflash.softmax, t.cpu(), -1)
    with c.sub("torch tensors as b and as states"):
        lw = cuflash.logsumexp(t, axis=-1, b=torch.full((1000,), 0.25, device=TDEV))
        compare("lse b torch", lw, ss.logsumexp(host(t), axis=-1, b=0.25), rtol=2e-6, atol=2e-6)
        m, l = cuflash.online_softmax_state(t)
        mt, lt = torch.as_tensor(m, device=TDEV), torch.as_tensor(l, device=TDEV)
        mm, ll = cuflash.merge_states((mt, lt), (m, l))
        compare("merge torch", mm, host(m), dtype=F32)
        compare("merge torch l", ll, 2 * host(l), rtol=1e-6, dtype=F32)


# ------------------------------------------------------------------------------------------------------------
# LayerNorm / RMSNorm
@check("norm_forward_backward_matrix")
def _(c):
    rng = rng_for(c.name)
    plan = [(F32, (7, 1024, 65537)), (BF16, (3, 4096, 65537)), (F16, (1000,))]
    for dt, hiddens in plan:
        for hidden in hiddens:
            rows = 5 if hidden > 10000 else 9
            for kind in ("layer", "rms"):
                lab = f"{kind} {dt} {rows}x{hidden}"
                with c.sub(f"{lab} plain"):
                    x64 = rounded(rng.standard_normal((rows, hidden)) * 2 + 3, dt)
                    eps = 1e-5 if kind == "layer" else eps_of(dt)
                    y = _norm(kind)(to_dev(x64, dt), hidden)
                    y_check(f"{lab} plain y", y, x64, 1, kind, eps=eps, dt=dt)
                norm_full(c, f"{lab} w+b+res+stats", kind, dt, (rows, hidden), 1, rng)
                if dt != F32 and hidden in (4096, 1000):
                    norm_full(c, f"{lab} float32 weights", kind, dt, (rows, hidden), 1, rng, wdt=F32)
                if kind == "layer" and hidden in (1024, 4096):
                    for wb in ("weight only", "bias only"):
                        with c.sub(f"{lab} {wb}"):
                            x64 = rounded(rng.standard_normal((rows, hidden)) * 2 - 1, dt)
                            p64 = rounded(rng.standard_normal(hidden), dt)
                            w, b = (p64, None) if wb == "weight only" else (None, p64)
                            y = cuflash.layer_norm(to_dev(x64, dt), (hidden,), None if w is None else to_dev(w, dt),
                                                   None if b is None else to_dev(b, dt))
                            y_check(f"{lab} {wb}", y, x64, 1, "layer", w, b, 1e-5, dt)


@check("norm_torch_argument_conventions", torch_needed=True)
def _(c):
    rng = rng_for(c.name)
    for dt, tdt in ((F32, torch.float32), (BF16, torch.bfloat16), (F16, torch.float16)):
        n = 1024
        x64 = rounded(rng.standard_normal((8, n)) * 2 + 1, dt)
        w64, b64 = rounded(rng.standard_normal(n), dt), rounded(rng.standard_normal(n), dt)
        tx, tw, tb = (torch.tensor(a, dtype=torch.float64, device=TDEV).to(tdt) for a in (x64, w64, b64))
        xd, wd, bd = to_dev(x64, dt), to_dev(w64, dt), to_dev(b64, dt)
        S = 2 * (eps_of(dt) + 64 * U32)
        with c.sub(f"{dt} layer_norm(x, (n,), w, b, 1e-3) positional, as F.layer_norm"):
            got = cuflash.layer_norm(xd, (n,), wd, bd, 1e-3)
            want = TF.layer_norm(tx, (n,), tw, tb, 1e-3)
            compare("vs torch", got, host(want), atol=S * (np.abs(host(want)) + 1) * 4, dtype=dt)
            y_check("vs float64", got, x64, 1, "layer", w64, b64, 1e-3, dt)
        with c.sub(f"{dt} layer_norm default eps (1e-5) as F.layer_norm"):
            xm64 = rounded(x64 * 0.001, dt)  # variance ~4e-6: the default eps shows
            got = cuflash.layer_norm(to_dev(xm64, dt), n)
            want = TF.layer_norm(torch.tensor(xm64, dtype=torch.float64, device=TDEV).to(tdt), (n,))
            compare("vs torch", got, host(want), atol=S * (np.abs(host(want)) + 1) * 4, dtype=dt)
        # eps=None: the docstring says finfo(x.dtype).eps "as torch.nn.functional.rms_norm"; small-RMS rows make
        # the default visible (mean(x^2) ~ 1e-4)
        xs64 = rounded(rng.standard_normal((8, n)) * 0.01, dt)
        txs = torch.tensor(xs64, dtype=torch.float64, device=TDEV).to(tdt)
        with c.sub(f"{dt} rms_norm(x, (n,), w) default eps vs F.rms_norm(x, (n,), w)"):
            got = cuflash.rms_norm(to_dev(xs64, dt), (n,), wd)
            want = TF.rms_norm(txs, (n,), tw)
            try:
                compare("vs torch", got, host(want), atol=S * (np.abs(host(want)) + 1) * 4, dtype=dt)
            except Fail as e:
                fits = []
                for name, ev in (("finfo(x.dtype).eps", eps_of(dt)), ("finfo(float32).eps", eps_of(F32)),
                                 ("1e-6", 1e-6), ("1e-5", 1e-5)):
                    r = norm_ref("rms", xs64, 1, w64, eps=ev)[0]
                    fits.append(f"{name}={ev:.3g}: cuflash err {np.nanmax(np.abs(host(got) - r)):.2g}, torch err "
                                f"{np.nanmax(np.abs(host(want) - r)):.2g}")
                raise Fail(f"{e}; float64 rms_norm with eps " + "; ".join(fits))
        with c.sub(f"{dt} rms_norm explicit eps=1e-6 as F.rms_norm"):
            got = cuflash.rms_norm(to_dev(xs64, dt), (n,), wd, 1e-6)
            want = TF.rms_norm(txs, (n,), tw, 1e-6)
            compare("vs torch", got, host(want), atol=S * (np.abs(host(want)) + 1) * 4, dtype=dt)
    with c.sub("normalized_shape of three dims, float32, vs F.layer_norm / F.rms_norm"):
        x64 = rounded(rng.standard_normal((2, 3, 4, 5, 6)) * 2 + 1, F32)
        w64, b64 = rounded(rng.standard_normal((4, 5, 6)), F32), rounded(rng.standard_normal((4, 5, 6)), F32)
        tx, tw, tb = (torch.tensor(a, dtype=torch.float32, device=TDEV) for a in (x64, w64, b64))
        got = cuflash.layer_norm(to_dev(x64, F32), (4, 5, 6), to_dev(w64, F32), to_dev(b64, F32))
        compare("layer", got, host(TF.layer_norm(tx, (4, 5, 6), tw, tb)), atol=1e-5, dtype=F32)
        got = cuflash.rms_norm(to_dev(x64, F32), (4, 5, 6), to_dev(w64, F32))
        compare("rms", got, host(TF.rms_norm(tx, (4, 5, 6), tw)), atol=1e-5, dtype=F32)


@check("norm_backward_vs_torch_autograd", torch_needed=True)
def _(c):
    rng = rng_for(c.name)
    for kind in ("layer", "rms"):
        for lab, shape, nd, wmode in (("2-d", (6, 33), 1, "w"), ("3-d over 2 dims", (3, 4, 33), 2, "w"),
                                      ("no weight", (5, 64), 1, None), ("zero/neg weight", (5, 257), 1, "zn"),
                                      ("1-d x, 0-d stats", (1000,), 1, "w")):
            with c.sub(f"{kind} {lab}"):
                nshape = shape[len(shape) - nd:]
                x64 = rounded(rng.standard_normal(shape) * 2 + 1, F32)
                dy64 = rounded(rng.standard_normal(shape), F32)
                w64 = None
                if wmode:
                    w64 = rng.standard_normal(nshape)
                    if wmode == "zn":
                        w64.reshape(-1)[::3] = 0.0
                        w64 = -np.abs(w64)
                    w64 = rounded(w64, F32)
                b64 = rounded(rng.standard_normal(nshape), F32) if (kind == "layer" and wmode) else None
                xd = to_dev(x64, F32)
                wd = None if w64 is None else to_dev(w64, F32)
                if kind == "layer":
                    y, mean, rstd = cuflash.layer_norm(xd, nshape, wd, None if b64 is None else to_dev(b64, F32),
                                                       return_stats=True)
                    outs = cuflash.layer_norm_backward(to_dev(dy64, F32), xd, wd, mean, rstd)
                else:
                    y, rstd = cuflash.rms_norm(xd, nshape, wd, 1e-5, return_stats=True)
                    mean = None
                    outs = cuflash.rms_norm_backward(to_dev(dy64, F32), xd, wd, rstd)
                exp_stat = shape[:len(shape) - nd]
                if rstd.shape != exp_stat:
                    raise Fail(f"rstd shape {rstd.shape}, expected {exp_stat}")
                tx = torch.tensor(x64, dtype=torch.float64, device=TDEV, requires_grad=True)
                tw = None if w64 is None else torch.tensor(w64, dtype=torch.float64, device=TDEV, requires_grad=True)
                tb = None if b64 is None else torch.tensor(b64, dtype=torch.float64, device=TDEV, requires_grad=True)
                if kind == "layer":
                    ty = TF.layer_norm(tx, nshape, tw, tb, 1e-5)
                else:
                    ty = TF.rms_norm(tx, nshape, tw, 1e-5)
                ty.backward(torch.tensor(dy64, dtype=torch.float64, device=TDEV))
                y_check("y vs torch float64", y, x64, nd, kind, w64, b64, 1e-5, F32, ref=host(ty))
                _, _, _, sdx, sdw, sdb, rows, hidden = bwd_ref(kind, dy64, x64, w64, None if mean is None else host(mean),
                                                               host(rstd), nd)
                tol = (8 * math.sqrt(hidden) + 32) * U32 + 2 * eps_of(F32)
                compare("dx vs torch", outs[0], host(tx.grad),
                        atol=(tol * sdx).reshape(shape[:len(shape) - nd] + (1,) * nd) + 1e-30, dtype=F32)
                tolc = (8 * math.sqrt(rows) + 32) * U32 + 2 * eps_of(F32)
                if tw is not None:
                    compare("dweight vs torch", outs[1], host(tw.grad), atol=(tol + tolc) * sdw.reshape(nshape) + 1e-30,
                            dtype=F32)
                elif outs[1] is not None:
                    raise Fail(f"dweight should be None without weight, got {desc(outs[1])}")
                if kind == "layer":
                    want_db = host(tb.grad) if tb is not None else dy64.reshape(-1, hidden).sum(0).reshape(nshape)
                    compare("dbias", outs[2], want_db, atol=tolc * sdb.reshape(nshape) + 1e-30, dtype=F32)


@check("norm_normalized_shape_forms_and_ranks")
def _(c):
    rng = rng_for(c.name)
    x64 = rounded(rng.standard_normal((4, 3, 5, 8)) * 2 + 1, F32)
    xd = to_dev(x64, F32)
    forms = [("tuple", (3, 5, 8)), ("list", [3, 5, 8]), ("np.array", np.array([3, 5, 8])),
             ("np.int64 entries", (np.int64(3), np.int64(5), np.int64(8)))]
    if torch is not None:
        forms.append(("torch.Size", torch.Size([3, 5, 8])))
    w64 = rounded(rng.standard_normal((3, 5, 8)), F32)
    for lab, ns in forms:
        with c.sub(f"normalized_shape as {lab}"):
            y, mean, rstd = cuflash.layer_norm(xd, ns, to_dev(w64, F32), None, return_stats=True)
            y_check(lab, y, x64, 3, "layer", w64, None, 1e-5, F32)
            stats_check(lab, "layer", x64, 3, (mean, rstd), 1e-5)
    for nd in (1, 2, 4):
        for kind in ("layer", "rms"):
            with c.sub(f"{kind} over the last {nd} dims, backward with those stats"):
                norm_full(c, f"{kind} nd={nd}", kind, F32, x64.shape, nd, rng)
    with c.sub("normalized_shape int as np.int64"):
        y = cuflash.rms_norm(xd, np.int64(8))
        y_check("np.int64", y, x64, 1, "rms", eps=eps_of(F32), dt=F32)
    for kind in ("layer", "rms"):
        with c.sub(f"{kind} 1-d x (0-d statistics) forward and backward"):
            norm_full(c, f"{kind} 1-d", kind, BF16, (3000,), 1, rng)
        with c.sub(f"{kind} hidden 1"):
            norm_full(c, f"{kind} hidden 1", kind, F32, (11, 1), 1, rng)


@check("norm_noncontiguous_inputs_match_contiguous")
def _(c):
    rng = rng_for(c.name)
    for dt in (F32, BF16):
        base = to_dev(rng.standard_normal((128, 512)) * 2 + 1, dt)
        flat = to_dev(rng.standard_normal(1 + 64 * 512) * 2 + 1, dt)
        row = to_dev(rng.standard_normal(512), dt)
        wbig = to_dev(rng.standard_normal(1024), F32)
        bias = to_dev(rng.standard_normal(512), F32)
        views = [("transposed", to_dev(rng.standard_normal((512, 64)), dt).T), ("every other row", base[::2]),
                 ("reversed hidden", base[:64, ::-1]), ("reversed rows", base[::-1][:64]),
                 ("fortran", cp.asfortranarray(base[:64])), ("broadcast rows", cp.broadcast_to(row, (64, 512))),
                 ("offset 1 element", flat[1:].reshape(64, 512))]
        wviews = [("weight stride 2", wbig[::2]), ("weight broadcast", cp.broadcast_to(cp.asarray(0.5, cp.float32), (512,))),
                  ("bias reversed", bias[::-1])]
        for lab, v in views:
            vc = cp.ascontiguousarray(v)
            for kind in ("layer", "rms"):
                with c.sub(f"{dt} {kind} {lab}"):
                    out = _norm(kind)(v, 512, wbig[::2], **({} if kind == "rms" else {"bias": bias[::-1]}),
                                      residual=v[::-1] if v.shape[0] > 1 else None, return_stats=True)
                    ref = _norm(kind)(vc, 512, cp.ascontiguousarray(wbig[::2]),
                                      **({} if kind == "rms" else {"bias": cp.ascontiguousarray(bias[::-1])}),
                                      residual=cp.ascontiguousarray(v[::-1]), return_stats=True)
                    for i, (a, b) in enumerate(zip(out, ref)):
                        same_bits(f"output {i}", a, b)
                    h64 = host(out[1])
                    y_check("y vs float64", out[0], h64, 1, kind, host(wbig[::2]),
                            None if kind == "rms" else host(bias[::-1]), 1e-5 if kind == "layer" else eps_of(dt), dt)
        for lab, wv in wviews:
            with c.sub(f"{dt} {lab}"):
                x = base[:16]
                if lab.startswith("bias"):
                    a = cuflash.layer_norm(x, 512, None, wv)
                    b = cuflash.layer_norm(x, 512, None, cp.ascontiguousarray(wv))
                else:
                    a = cuflash.rms_norm(x, 512, wv)
                    b = cuflash.rms_norm(x, 512, cp.ascontiguousarray(wv))
                same_bits(lab, a, b)
        with c.sub(f"{dt} backward with strided dy, x, weight and statistics"):
            x = base[::2]
            y, mean, rstd = cuflash.layer_norm(x, 512, wbig[::2], bias, return_stats=True)
            mbig, rbig = cp.repeat(mean, 2), cp.repeat(rstd, 2)
            dy = to_dev(rng.standard_normal((512, 64)), dt).T
            a = cuflash.layer_norm_backward(dy, x, wbig[::2], mbig[::2], rbig[1::2])
            b = cuflash.layer_norm_backward(cp.ascontiguousarray(dy), cp.ascontiguousarray(x),
                                            cp.ascontiguousarray(wbig[::2]), mean, rstd)
            for i, (u, v) in enumerate(zip(a, b)):
                same_bits(f"grad {i}", u, v)
            bwd_check("strided bwd", "layer", a, dy, x, wbig[::2], mean, rstd, 1)


@check("norm_edge_values")
def _(c):
    rng = rng_for(c.name)
    n = 1024
    with c.sub("all-equal rows: LayerNorm y == bias, rstd == 1/sqrt(eps)"):
        x = cp.full((3, n), 2.5, cp.float32)
        b = to_dev(rng.standard_normal(n), F32)
        y, mean, rstd = cuflash.layer_norm(x, n, to_dev(rng.standard_normal(n), F32), b, return_stats=True)
        compare("y", y, np.broadcast_to(host(b), (3, n)), dtype=F32)
        compare("rstd", rstd, np.full(3, 1 / math.sqrt(1e-5)), rtol=1e-6, dtype=F32)
        compare("mean", mean, np.full(3, 2.5), dtype=F32)
    with c.sub("float32 huge magnitudes (1e15) and large mean / small spread"):
        x64 = rounded(np.vstack([rng.standard_normal((2, n)) * 1e15, rng.standard_normal((2, n)) + 3e4]), F32)
        for kind in ("layer", "rms"):
            y, *st = _norm(kind)(to_dev(x64, F32), n, return_stats=True)
            y_check(f"{kind} y", y, x64, 1, kind, eps=1e-5 if kind == "layer" else eps_of(F32), dt=F32)
    with c.sub("NaN in one row / inf in another: only that row is poisoned (vs torch-free float64 rule)"):
        x64 = rounded(rng.standard_normal((4, n)), F32)
        x64[1, 17] = np.nan
        x64[2, 5] = np.inf
        yl = host(cuflash.layer_norm(to_dev(x64, F32), n))
        yr = host(cuflash.rms_norm(to_dev(x64, F32), n))
        if not (np.isnan(yl[1]).all() and np.isnan(yl[2]).all() and np.isfinite(yl[[0, 3]]).all()):
            raise Fail(f"layer_norm NaN/inf rows: row1 NaN {np.isnan(yl[1]).sum()}/{n}, row2 NaN "
                       f"{np.isnan(yl[2]).sum()}/{n}, rows 0/3 finite {np.isfinite(yl[[0, 3]]).all()}")
        if not (np.isnan(yr[1]).all() and np.isnan(yr[2, 5]) and (np.delete(yr[2], 5) == 0).all()
                and np.isfinite(yr[[0, 3]]).all()):
            raise Fail("rms_norm NaN/inf rows differ from h * rsqrt(mean(h^2)) (NaN row, inf -> 0 elsewhere, "
                       f"NaN at the inf): row2[5]={yr[2, 5]}, row2 zeros {(np.delete(yr[2], 5) == 0).sum()}/{n - 1}")
    with c.sub("NaN in a weight column, inf in a bias column: only that column"):
        x64 = rounded(rng.standard_normal((4, n)), F32)
        w64 = rounded(rng.standard_normal(n), F32)
        b64 = rounded(rng.standard_normal(n), F32)
        w64[3] = np.nan
        b64[7] = np.inf
        y = cuflash.layer_norm(to_dev(x64, F32), n, to_dev(w64, F32), to_dev(b64, F32))
        y_check("y", y, x64, 1, "layer", w64, b64, 1e-5, F32)
    with c.sub("tiny magnitudes (1e-30), default eps"):
        x64 = rounded(rng.standard_normal((3, n)) * 1e-30, F32)
        for kind in ("layer", "rms"):
            eps = 1e-5 if kind == "layer" else eps_of(F32)
            y = _norm(kind)(to_dev(x64, F32), n)
            y_check(f"{kind}", y, x64, 1, kind, eps=eps, dt=F32)
    for kind in ("layer", "rms"):
        # documented (cuflash/norm.py): CuPy's -ftz=true flushes these float32 squares to zero, so with eps=0 the
        # variance is 0 and the row is not finite; against an eps of 1e-30 the flushed squares are negligible
        with c.sub(f"{kind} tiny magnitudes (1e-20: squares are float32 subnormals), eps=0: not finite (documented)"):
            x64 = rounded(rng.standard_normal((3, n)) * 1e-20, F32)
            y = _norm(kind)(to_dev(x64, F32), n, None, **({"eps": 0.0}))
            if bool(cp.isfinite(y).all()):
                raise Fail("finite output: subnormal squares are no longer flushed; update cuflash/norm.py's docstring")
        with c.sub(f"{kind} tiny magnitudes (1e-20), eps=1e-30"):
            y = _norm(kind)(to_dev(x64, F32), n, None, **({"eps": 1e-30}))
            y_check(f"{kind}", y, x64, 1, kind, eps=1e-30, dt=F32)
    with c.sub("rms_norm all-zero row with eps=0 -> NaN (0 * inf), as float64 / torch"):
        y = cuflash.rms_norm(cp.zeros((2, n), cp.float32), n, None, 0.0)
        if not bool(cp.isnan(y).all()):
            raise Fail(f"expected NaN everywhere, got {int(cp.isnan(y).sum())} NaN of {y.size}")
    with c.sub("float16 residual overflow: h = 60000 + 60000 = inf"):
        x = cp.full((2, n), 60000, cp.float16)
        x[1] = to_dev(rng.standard_normal(n), F16)
        r = cp.full((2, n), 60000, cp.float16)
        r[1] = 0
        for kind in ("layer", "rms"):
            y, h = _norm(kind)(x, n, residual=r)
            if not bool(cp.isinf(h[0]).all()):
                raise Fail(f"{kind}: h row 0 should be +inf (float16 overflow), got {host(h[0])[:4]}")
            y_check(f"{kind} y row 1", y[1:], host(h[1:]), 1, kind, eps=1e-5 if kind == "layer" else eps_of(F16), dt=F16)
            y0 = host(y[0])
            if not np.isnan(y0).all():
                raise Fail(f"{kind}: y of the all-inf row should be NaN (inf - inf / inf * 0), got {y0[:4]}")
    with c.sub("float16 large |x| ~ 3e4 RMSNorm stays finite (float32 sum of squares)"):
        x64 = rounded(rng.uniform(2e4, 6e4, (3, 4097)) * rng.choice([-1, 1], (3, 4097)), F16)
        y = cuflash.rms_norm(to_dev(x64, F16), 4097)
        y_check("rms f16 large", y, x64, 1, "rms", eps=eps_of(F16), dt=F16)
    with c.sub("eps argument forms: np.float32, int 0, bfloat16 scalar, huge"):
        x64 = rounded(rng.standard_normal((3, n)), F32)
        for ev in (np.float32(1e-3), 0, ml_dtypes.bfloat16(0.5), 1e30):
            y = cuflash.layer_norm(to_dev(x64, F32), n, eps=ev)
            y_check(f"eps={ev!r}", y, x64, 1, "layer", eps=float(ev), dt=F32)


@check("norm_many_rows_and_empty")
def _(c):
    g = cp.random.RandomState(21)
    for kind, dt, shape, wdt in (("rms", F32, (70001, 3), F32), ("layer", BF16, (100000, 64), F32),
                                 ("layer", F16, (70001, 1), F16), ("rms", BF16, (70003, 769), BF16)):
        lab = f"{kind} {dt} {shape[0]}x{shape[1]}"
        with c.sub(lab):
            x = (g.standard_normal(shape, dtype=cp.float32) * 2 + 1).astype(dt)
            r = g.standard_normal(shape, dtype=cp.float32).astype(dt)
            w = (g.standard_normal(shape[1:], dtype=cp.float32)).astype(wdt)
            b = g.standard_normal(shape[1:], dtype=cp.float32).astype(wdt) if kind == "layer" else None
            poison(x.nbytes)
            if kind == "layer":
                y, h, mean, rstd = cuflash.layer_norm(x, shape[1], w, b, 1e-5, residual=r, return_stats=True)
            else:
                y, h, rstd = cuflash.rms_norm(x, shape[1], w, 1e-5, residual=r, return_stats=True)
                mean = None
            for name, a in (("y", y), ("h", h), ("rstd", rstd)):
                if nan_count(a):
                    raise Fail(f"{name}: {nan_count(a)} NaN (rows left unwritten?) {desc(a)}")
            sel = np.unique(np.r_[0:3, shape[0] - 3:shape[0], np.random.default_rng(1).integers(0, shape[0], 64)])
            hs = host(h[sel])
            y_check(f"{lab} y", y[sel], hs, 1, kind, host(w), None if b is None else host(b), 1e-5, dt)
            stats_check(lab, kind, hs, 1, (mean[sel], rstd[sel]) if kind == "layer" else (rstd[sel],), 1e-5)
            dy = g.standard_normal(shape, dtype=cp.float32).astype(dt)
            outs = call_bwd(kind, dy, h, w, mean, rstd)
            if shape[1] <= 64:  # every column sum against float64 (all rows on the host)
                bwd_check(f"{lab} bwd", kind, outs, dy, h, w, mean, rstd, 1)
            elif nan_count(outs[0]):
                raise Fail(f"dx has {nan_count(outs[0])} NaN")
    for kind in ("layer", "rms"):
        with c.sub(f"{kind} (0, 8): empty outputs and statistics"):
            x = cp.zeros((0, 8), cp.float32)
            out = _norm(kind)(x, 8, cp.ones(8, cp.float32), residual=x, return_stats=True)
            shapes = [o.shape for o in out]
            want = [(0, 8), (0, 8)] + [(0,)] * (2 if kind == "layer" else 1)
            if shapes != want:
                raise Fail(f"shapes {shapes}, expected {want}")
            rs = cp.zeros((0,), cp.float32)
            g_ = call_bwd(kind, x, x, cp.ones(8, cp.float32), rs, rs)
            if g_[0].shape != (0, 8) or g_[1].shape != (8,) or float(cp.abs(g_[1]).sum()) != 0:
                raise Fail(f"backward on 0 rows: {desc(g_)}")
            if kind == "layer" and (g_[2].shape != (8,) or g_[2].dtype != F32 or float(cp.abs(g_[2]).sum()) != 0):
                raise Fail(f"dbias on 0 rows: {desc(g_[2])}")
        with c.sub(f"{kind} (3, 0, 4) normalized over (4,): zero rows"):
            y = _norm(kind)(cp.zeros((3, 0, 4), cp.float32), 4)
            if y.shape != (3, 0, 4):
                raise Fail(f"shape {y.shape}")


@check("norm_nondefault_stream")
def _(c):
    s = cp.cuda.Stream(non_blocking=True)
    sync()
    with s:
        big = cp.random.RandomState(6).standard_normal((4096, 4096), dtype=cp.float32)
        for _ in range(30):
            big = cp.sin(big) * 3.0 + 1.0
        cases = [("layer f32 64x16384 (streamed)", "layer", big[:256].reshape(64, 16384) * 1.0, None, False),
                 ("layer bf16 8x32768 (streamed)", "layer", big[:64].reshape(8, 32768).astype(BF16), None, False),
                 ("rms bf16 256x4096 + residual", "rms", big[:256].astype(BF16), big[256:512].astype(BF16), True),
                 ("layer f32 300x1000 + residual", "layer", big[:300, :1000] * 1.0, big[300:600, :1000] * 1.0, True)]
        outs = []
        for lab, kind, x, r, _ in cases:
            n = x.shape[1]
            w = cp.ones(n, cp.float32) * 0.5
            if kind == "layer":
                o = cuflash.layer_norm(x, n, w, None, 1e-5, residual=r, return_stats=True)
                hh = o[1] if r is not None else x
                mean, rstd = o[-2], o[-1]
            else:
                o = cuflash.rms_norm(x, n, w, 1e-5, residual=r, return_stats=True)
                hh = o[1] if r is not None else x
                mean, rstd = None, o[-1]
            dy = cp.sin(x.astype(cp.float32)).astype(x.dtype)
            gr = call_bwd(kind, dy, hh, w, mean, rstd)
            outs.append((o, hh, dy, w, mean, rstd, gr))
    s.synchronize()
    for (lab, kind, x, r, _), (o, hh, dy, w, mean, rstd, gr) in zip(cases, outs):
        with c.sub(lab):
            n = x.shape[1]
            if r is not None:
                compare("h", hh, rounded(host(x) + host(r), x.dtype), rtol=eps_of(x.dtype), dtype=x.dtype)
            h64 = host(hh)
            y_check("y", o[0], h64, 1, kind, host(w), None, 1e-5, x.dtype)
            stats_check("stats", kind, h64, 1, (mean, rstd) if kind == "layer" else (rstd,), 1e-5)
            bwd_check("bwd", kind, gr, dy, hh, w, mean, rstd, 1)


@check("norm_torch_dlpack", torch_needed=True)
def _(c):
    t = torch.randn(32, 1024, device=TDEV) * 2 + 1
    w = torch.randn(1024, device=TDEV)
    b = torch.randn(1024, device=TDEV)
    r = torch.randn(32, 1024, device=TDEV)
    with c.sub("float32 tensors as x, weight, bias, residual"):
        y, h = cuflash.layer_norm(t, 1024, w, b, residual=r)
        compare("h", h, host(t + r), rtol=eps_of(F32), dtype=F32)
        compare("y vs F.layer_norm", y, host(TF.layer_norm(t + r, (1024,), w, b)), atol=2e-5 * (1 + np.abs(host(w))).max()
                + 2e-5 * np.abs(host(b)).max(), dtype=F32)
    with c.sub("float16 tensors, transposed x"):
        th = torch.randn(1024, 32, device=TDEV).half().T
        y = cuflash.rms_norm(th, 1024, w.half(), 1e-5)
        y_check("rms f16 torch", y, host(th), 1, "rms", host(w.half()), None, 1e-5, F16)
    with c.sub("bfloat16 tensor directly (a result, or a TypeError that says why)"):
        tb = t.bfloat16()
        try:
            y = cuflash.layer_norm(tb, 1024)
        except TypeError as e:
            if not any(s in str(e).lower() for s in ("bfloat16", "dlpack", "dtype", "view")):
                raise Fail(f"TypeError without a reason: {e!r}")
        else:
            y_check("bf16 torch", y, host(tb), 1, "layer", eps=1e-5, dt=np.dtype(y.dtype))
    with c.sub("nn.LayerNorm's weight (a Parameter, requires_grad) -> TypeError naming detach()"):
        ln = torch.nn.LayerNorm(1024).to(TDEV)
        expect_error("Parameter", TypeError, ["grad|detach"], cuflash.layer_norm, t, 1024, ln.weight, ln.bias)
    with c.sub("the same weights detached"):
        ln = torch.nn.LayerNorm(1024).to(TDEV)
        y = cuflash.layer_norm(t, 1024, ln.weight.detach(), ln.bias.detach())
        compare("vs nn.LayerNorm", y, host(ln(t)), atol=3e-5 * 8, dtype=F32)
    with c.sub("CPU tensor x -> TypeError"):
        expect_error("cpu tensor", TypeError, ["GPU|CUDA|CuPy|host|cpu|device"], cuflash.rms_norm, t.cpu(), 1024)


@check("norm_stale_results_same_shape")
def _(c):
    rng = rng_for(c.name)
    for kind in ("layer", "rms"):
        for dt, n in ((BF16, 4096), (F32, 1000)):
            with c.sub(f"{kind} {dt} {n}: two inputs, two weights, alternating residual / stats"):
                xs = [rounded(rng.standard_normal((33, n)) * s + l, dt) for s, l in ((1, 0), (3, 5))]
                ws = [rounded(rng.standard_normal(n), F32) for _ in range(2)]
                bs = [rounded(rng.standard_normal(n), F32) for _ in range(2)]
                res = [None, rounded(rng.standard_normal((33, n)), dt)]
                results = []
                for i in range(4):
                    j = i % 2
                    kw = {"residual": None if res[j] is None else to_dev(res[j], dt), "return_stats": j == 1}
                    if kind == "layer":
                        o = cuflash.layer_norm(to_dev(xs[j], dt), n, to_dev(ws[j], F32), to_dev(bs[j], F32), **kw)
                    else:
                        o = cuflash.rms_norm(to_dev(xs[j], dt), n, to_dev(ws[j], F32), 1e-5, **kw)
                    results.append((j, o))
                for i, (j, o) in enumerate(results):
                    y = o[0] if isinstance(o, tuple) else o
                    h64 = xs[j] if res[j] is None else host(o[1])
                    y_check(f"call {i}", y, h64, 1, kind, ws[j], bs[j] if kind == "layer" else None,
                            1e-5, dt)
            with c.sub(f"{kind} {dt} {n}: backward with two weights"):
                x = to_dev(xs[1], dt)
                if kind == "layer":
                    _, mean, rstd = cuflash.layer_norm(x, n, return_stats=True)
                else:
                    _, rstd = cuflash.rms_norm(x, n, None, 1e-5, return_stats=True)
                    mean = None
                dy = to_dev(rng.standard_normal((33, n)), dt)
                g1 = call_bwd(kind, dy, x, to_dev(ws[0], F32), mean, rstd)
                g2 = call_bwd(kind, dy, x, to_dev(ws[1], F32), mean, rstd)
                bwd_check("second", kind, g2, dy, x, to_dev(ws[1], F32), mean, rstd, 1)
                bwd_check("first", kind, g1, dy, x, to_dev(ws[0], F32), mean, rstd, 1)


@check("norm_backward_deterministic_bitwise")
def _(c):
    g = cp.random.RandomState(31)
    for kind in ("layer", "rms"):
        for dt, rows, n, wdt in ((BF16, 4099, 4096, F32), (F32, 300, 1000, F32), (BF16, 257, 32768, BF16),
                                 (F32, 20011, 64, None)):
            with c.sub(f"{kind} {dt} {rows}x{n}"):
                x = g.standard_normal((rows, n), dtype=cp.float32).astype(dt)
                dy = g.standard_normal((rows, n), dtype=cp.float32).astype(dt)
                w = None if wdt is None else g.standard_normal(n, dtype=cp.float32).astype(wdt)
                if kind == "layer":
                    _, mean, rstd = cuflash.layer_norm(x, n, w, None, return_stats=True)
                else:
                    _, rstd = cuflash.rms_norm(x, n, w, 1e-5, return_stats=True)
                    mean = None
                a = call_bwd(kind, dy, x, w, mean, rstd)
                b = call_bwd(kind, dy, x, w, mean, rstd)
                for i, (u, v) in enumerate(zip(a, b)):
                    if u is not None:
                        same_bits(f"{('dx', 'dweight', 'dbias')[i]}", u, v)


@check("norm_forward_deterministic_bitwise_undocumented")
def _(c):
    g = cp.random.RandomState(32)
    for kind in ("layer", "rms"):
        for dt, rows, n in ((F32, 64, 16384), (BF16, 40, 32768), (BF16, 1000, 4096), (F32, 2000, 8192)):
            with c.sub(f"{kind} {dt} {rows}x{n}"):
                x = g.standard_normal((rows, n), dtype=cp.float32).astype(dt)
                a = _norm(kind)(x, n, return_stats=True)
                b = _norm(kind)(x, n, return_stats=True)
                for i, (u, v) in enumerate(zip(a, b)):
                    same_bits(f"output {i}", u, v)


# ------------------------------------------------------------------------------------------------------------
# run order: the README, the cheap error checks, then the checks most likely to find something (a cold kernel cache
# may run out of PROBE_BUDGET_S before the end; the rest then print SKIP)
ORDER = ["readme_api_tour_softmax", "readme_api_tour_layer_norm", "sm_bad_inputs_raise_clear_errors",
         "norm_bad_inputs_raise_clear_errors", "norm_torch_argument_conventions", "sm_axis_argument_types",
         "sm_default_axis_none_as_scipy", "norm_edge_values", "sm_edge_values_short_and_long_rows",
         "sm_noncontiguous_views", "sm_0d_empty_one_element", "sm_logsumexp_b_weights_and_return_sign",
         "sm_state_merge_roundtrips", "norm_forward_backward_matrix", "norm_backward_vs_torch_autograd",
         "norm_normalized_shape_forms_and_ranks", "norm_noncontiguous_inputs_match_contiguous", "sm_torch_dlpack",
         "norm_torch_dlpack", "sm_nondefault_stream", "norm_nondefault_stream", "sm_long_rows_few_rows",
         "sm_many_short_rows", "norm_many_rows_and_empty", "sm_axes_every_dtype", "sm_methods_safe_naive",
         "sm_odd_lengths", "sm_stale_results_same_shape", "norm_stale_results_same_shape",
         "norm_backward_deterministic_bitwise", "norm_forward_deterministic_bitwise_undocumented"]


def main():
    if "--list" in sys.argv:
        for name, _f_, tn in CHECKS:
            print(name + ("  (torch)" if tn else ""))
        return 0
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    try:
        gpu = gpu_name(cp)
    except Exception as e:
        gpu = f"? ({_exc_text(e)})"
    print(f"# newuser_probe: GPU {gpu}; cupy {cp.__version__}, numpy {np.__version__}, scipy {scipy.__version__}, "
          f"torch {torch.__version__ if torch is not None else TORCH_WHY}; budget {BUDGET:.0f} s", flush=True)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    state = {"name": None, "t": time.time()}
    start_watchdog(T0, HARD, state, counts)
    rank = {n: i for i, n in enumerate(ORDER)}
    for name, f, torch_needed in sorted(CHECKS, key=lambda t: rank.get(t[0], len(ORDER))):
        if only and not any(s in name for s in only):
            continue
        if time.time() - T0 > BUDGET:
            print(f"SKIP {name}: time budget of {BUDGET:.0f} s spent (PROBE_BUDGET_S)", flush=True)
            counts["SKIP"] += 1
            continue
        if torch_needed and torch is None:
            print(f"SKIP {name}: {TORCH_WHY}", flush=True)
            counts["SKIP"] += 1
            continue
        c = Check(name)
        state["name"], state["t"] = name, time.time()
        try:
            f(c)
        except Skip as e:
            print(f"SKIP {name}: {e}", flush=True)
            counts["SKIP"] += 1
            continue
        except Fail as e:
            c.fails.append(str(e))
        except Exception as e:
            c.fails.append(f"unexpected {_exc_text(e)}")
        try:
            sync()  # an asynchronous kernel fault surfaces here
        except Exception as e:
            c.fails.append(f"device error after the check: {_exc_text(e)}")
        dt = time.time() - state["t"]
        if c.fails:
            counts["FAIL"] += 1
            print(f"FAIL {name}: " + " | ".join(c.fails) + f"  [{len(c.fails)} of {c.steps} steps failed, {dt:.1f} s]",
                  flush=True)
        else:
            counts["PASS"] += 1
            print(f"PASS {name}  [{c.steps} steps, {dt:.1f} s]", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    total = sum(counts.values())
    print(f"SUMMARY: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped of {total} checks "
          f"in {time.time() - T0:.1f} s", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
