#!/usr/bin/env python3
"""A new user's probe of cuflash's exact attention (``cuflash.attention``, ``cuflash.attention_backward``), public API.

Run from the repository root on a GPU machine (written for the H200: compute capability 9.0, where
``schedule="auto"`` runs the Hopper wgmma kernel for float16 / bfloat16 and head_dim <= 128):

    PYTHONPATH=. python experiments/scratch/newuser_attn_probe.py             # every check
    PYTHONPATH=. python experiments/scratch/newuser_attn_probe.py nonfinite    # checks whose name contains a word
    PYTHONPATH=. python experiments/scratch/newuser_attn_probe.py --list      # the names

Prints ``PASS <check>``, ``FAIL <check>: <details>`` or ``SKIP <check>: <why>`` per check, then a summary; exit
status 1 if any check failed. References: float64 attention written here from the docstrings (softmax(q kᵀ·scale +
mask) v, its lse and analytic gradients, bottom-right aligned masks) on the GPU with CuPy, and torch
``scaled_dot_product_attention`` in float64 (with its autograd) where torch defines the semantics
(``torch.nn.attention.bias.causal_lower_right`` for bottom-right causal, ``enable_gqa``, ``scale``).

Tolerances (per element, derived, not tuned): u = unit roundoff of the input dtype (2^-8 bfloat16, 2^-11 float16,
2^-24 float32), E = u + eps32·(8·|scale|·max_j Σ_c|q_ic k_jc| + 4·sqrt(n) + 8) (P rounded to the dtype, float32
scores and accumulation), forward |out - ref| <= 3·E·(P|v|) + 2u|ref| + 1e-6·max|ref|, lse within 1e-4 + 1e-6|lse| +
8·eps32·|scale|·max Σ|q k|; gradients from the same error model through dS = P∘(dP - D) (see ``attn_ref``).

Environment: PROBE_BUDGET_S (default 105): no new check starts after that many seconds (the rest print SKIP);
PROBE_HARD_S (default 145): a watchdog reports the running check as hung and exits 1. Kernels compile with NVRTC on
first use, so a cold CuPy kernel cache costs most of the time (each line shows its seconds). PROBE_SMALL=1 shrinks the
README-sized and multi-GB cases (for a dry run of this script's own logic; PROBE_TORCH_DEVICE=cpu likewise).
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import math
import os
import re
import sys
import time
import warnings
import zlib
from pathlib import Path

T0 = time.time()

import numpy as np  # noqa: E402
import ml_dtypes  # noqa: E402

import cupy as cp  # noqa: E402

import cuflash  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

try:
    import torch
    import torch.nn.functional as TF

    TDEV = os.environ.get("PROBE_TORCH_DEVICE", "cuda")  # "cpu" only for a dry run of this script's own logic
    if TDEV == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA device")
    try:
        from torch.nn.attention.bias import causal_lower_right
    except Exception:  # older torch: an explicit boolean mask instead
        causal_lower_right = None
    TORCH_WHY = ""
except Exception as _e:  # torch is optional: its checks print SKIP
    torch = TF = TDEV = causal_lower_right = None
    TORCH_WHY = f"torch unavailable ({type(_e).__name__}: {_e})"

BUDGET = float(os.environ.get("PROBE_BUDGET_S", "105"))
HARD = float(os.environ.get("PROBE_HARD_S", "145"))
STEP_DEADLINE = min(BUDGET + 25.0, HARD - 8.0)  # no new step of a running check starts after this
SMALL = os.environ.get("PROBE_SMALL", "0") == "1"

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
U = {F16: 2.0 ** -11, BF16: 2.0 ** -8, F32: 2.0 ** -24}  # unit roundoff of the input dtype
EPS32 = 2.0 ** -23
FLOOR = 1e-6
SCHEDULES = ("auto", "fa2", "fa1", "standard")


from _probe_harness import (Fail, Skip, exc_text, gpu_name, raises_naming,  # noqa: E402  (experiments/scratch)
                            start_watchdog)

# ------------------------------------------------------------------------------------------------------------
# harness (the style of experiments/scratch/newuser_probe.py)
class OutOfTime(Exception):
    pass


def _exc_text(e):
    return exc_text(e, __file__)


class Check:
    def __init__(self, name):
        self.name = name
        self.fails = []
        self.notes = []
        self.steps = 0
        self.worst = 0.0  # largest error / tolerance ratio seen by close()

    @contextlib.contextmanager
    def sub(self, label):
        """One step: a Fail or any exception inside is recorded under ``label`` and the check goes on."""
        if time.time() - T0 > STEP_DEADLINE:
            raise OutOfTime(label)
        self.steps += 1
        try:
            yield
        except (Fail, AssertionError) as e:
            self.fails.append(f"[{label}] {e}")
        except Skip as e:  # a step that does not apply here (the check goes on)
            self.notes.append(f"[{label}] skipped: {e}")
        except OutOfTime:
            raise
        except Exception as e:  # a crash of cuflash (or of this script) is a failure of the step
            self.fails.append(f"[{label}] unexpected {_exc_text(e)}")

    def note(self, text):
        self.notes.append(text)


CHECKS = []


def check(name, torch_needed=False):
    def deco(f):
        CHECKS.append((name, f, torch_needed))
        return f
    return deco


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


CUR = {"check": None}


def dev64(a):
    """float64 CuPy copy of a CuPy array (bfloat16 widened by its bits), torch tensor, NumPy array or scalar."""
    if torch is not None and isinstance(a, torch.Tensor):
        t = a.detach().to(torch.float64).contiguous()
        return cp.from_dlpack(t).copy() if t.is_cuda else cp.asarray(t.numpy())
    if isinstance(a, cp.ndarray):
        if a.dtype == BF16:
            w = cp.ascontiguousarray(a.view(cp.uint16)).astype(cp.uint32) << 16
            return w.view(cp.float32).astype(cp.float64)
        return a.astype(cp.float64)
    return cp.asarray(np.asarray(a, dtype=np.float64))


def close(what, got, ref, tol):
    """|got - ref| <= tol elementwise where ref is finite, and the NaN / +inf / -inf patterns of got equal ref's.
    got: CuPy array, torch tensor or NumPy; ref, tol: float64 (CuPy or NumPy; tol broadcasts). On the device."""
    g, r = dev64(got), dev64(ref)
    if g.shape != r.shape:
        raise Fail(f"{what}: shape {g.shape}, expected {r.shape}")
    if not g.size:
        return
    for kind, fg, fr in (("NaN", cp.isnan(g), cp.isnan(r)), ("+inf", g == np.inf, r == np.inf),
                         ("-inf", g == -np.inf, r == -np.inf)):
        bad = fg != fr
        nb = int(bad.sum())
        if nb:
            i = np.unravel_index(int(cp.argmax(bad)), r.shape)
            raise Fail(f"{what}: {kind} pattern differs at {nb} of {g.size} elements, first at "
                       f"{tuple(int(x) for x in i)}: got {float(g[i]):.6g}, expected {float(r[i]):.6g}")
    t = cp.broadcast_to(dev64(tol), r.shape)
    t = cp.where(cp.isnan(t), cp.inf, t)
    fin = cp.isfinite(r)
    with np.errstate(all="ignore"):  # (NumPy only: inf - inf where ref is not finite, masked out)
        err = cp.where(fin, cp.abs(g - r), 0.0)
        ratio = cp.where(fin, err / cp.where(t > 0, t, 1e-300), 0.0)
    k = int(cp.argmax(ratio))
    worst = float(ratio.ravel()[k])
    if CUR["check"] is not None:
        CUR["check"].worst = max(CUR["check"].worst, worst)
    if worst > 1.0:
        i = np.unravel_index(k, r.shape)
        raise Fail(f"{what}: got {float(g[i]):.7g}, expected {float(r[i]):.7g} at {tuple(int(x) for x in i)} "
                   f"(allowed +-{float(t[i]):.3g}, {worst:.1f}x); max abs err {float(err.max()):.3g}, "
                   f"{int((ratio > 1).sum())} of {g.size} outside; shape {g.shape}")


def _bits(a):
    """The raw bits of a CuPy array as unsigned integers (contiguous)."""
    u = {1: cp.uint8, 2: cp.uint16, 4: cp.uint32, 8: cp.uint64}[a.dtype.itemsize]
    return cp.ascontiguousarray(a.view(u))


def same_bits(what, a, b):
    if not (isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray)):
        raise Fail(f"{what}: {desc(a)} vs {desc(b)} (not CuPy arrays)")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise Fail(f"{what}: {desc(a)} vs {desc(b)}")
    if a.size:
        diff = _bits(a) != _bits(b)
        nd = int(diff.sum())
        if nd:
            i = int(cp.argmax(diff.ravel()))
            fa, fb = dev64(a).ravel(), dev64(b).ravel()
            raise Fail(f"{what}: not bitwise equal: {nd} of {a.size} elements differ, first at flat index {i} "
                       f"({float(fa[i]):.7g} vs {float(fb[i]):.7g}), max abs diff "
                       f"{float(cp.nanmax(cp.abs(fa - fb))):.3g}; {desc(a)}")


def expect_error(what, exc, words, fn, *args, **kwargs):
    """fn(*args, **kwargs) must raise ``exc`` whose message names every word of ``words`` (_probe_harness)."""
    return raises_naming(what, exc, words, lambda: fn(*args, **kwargs), desc, _exc_text)


def desc(a):
    if a is None:
        return "None"
    if isinstance(a, tuple):
        return "(" + ", ".join(desc(x) for x in a) + ")"
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return f"{type(a).__name__}{tuple(a.shape)} {a.dtype}"
    return repr(a)[:80]


def sync():
    cp.cuda.Device().synchronize()


def is_sm90():
    try:
        return str(cp.cuda.Device().compute_capability) == "90"
    except Exception:
        return False


# ------------------------------------------------------------------------------------------------------------
# data: host float64 values exactly representable in the dtype; device arrays built from their bits
def rounded(x64, dt):
    with np.errstate(all="ignore"):
        return np.asarray(x64, np.float64).astype(dt).astype(np.float64)


def to_dev(x64, dt):
    dt = np.dtype(dt)
    with np.errstate(all="ignore"):
        h = np.asarray(x64, np.float64).astype(dt)
    if dt.itemsize == 2:
        return cp.asarray(np.ascontiguousarray(h).view(np.uint16)).view(dt)
    return cp.asarray(h)


def host_raw(a):
    """Host NumPy copy in the array's own dtype (16-bit data crosses as uint16 bits)."""
    if torch is not None and isinstance(a, torch.Tensor):
        t = a.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16).view(BF16)
        return t.numpy()
    if isinstance(a, cp.ndarray):
        if a.dtype.itemsize == 2 and a.dtype.kind != "i" and a.dtype.kind != "u":
            return cp.asnumpy(a.view(cp.uint16)).view(a.dtype)
        return cp.asnumpy(a)
    return np.asarray(a)


def host64(a):
    with np.errstate(all="ignore"):
        return host_raw(a).astype(np.float64)


def rand(rng, shape, dt, mag=1.0):
    h = rounded(rng.standard_normal(shape) * mag, dt)
    return h, to_dev(h, dt)


def inputs(rng, dt, B, Hq, Hkv, Sq, Sk, D, mag=1.0):
    """(host float64 q, k, v, dout), (device q, k, v, dout)."""
    hs, ds = [], []
    for i, s in enumerate(((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D), (B, Hq, Sq, D))):
        h, d = rand(rng, s, dt, mag if i < 2 else 1.0)
        hs.append(h)
        ds.append(d)
    return hs, ds


def dev_inputs(dt, B, Hq, Hkv, Sq, Sk, D, with_dout=True):
    """Large inputs made on the device (CuPy's generator, float32 rounded to dt); the reference reads them back."""
    g = cp.random.RandomState(zlib.crc32(f"{dt}{B}{Hq}{Hkv}{Sq}{Sk}{D}".encode()))
    shapes = [(B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)] + ([(B, Hq, Sq, D)] if with_dout else [])
    return [g.standard_normal(s, dtype=cp.float32).astype(dt) for s in shapes]


def bits16(a):
    return a.view(cp.uint16) if a.dtype.itemsize == 2 else a


def copy_into_layout(a, perm):
    """A copy of ``a`` stored in the axis order ``perm`` and viewed back in a's axis order (no dtype kernels)."""
    inv = [perm.index(i) for i in range(a.ndim)]
    return cp.ascontiguousarray(bits16(a).transpose(perm)).view(a.dtype).transpose(inv)


# ------------------------------------------------------------------------------------------------------------
# float64 reference, from the docstrings: row i of q sits at key position i + seqlen_k - seqlen_q and sees keys
# i + shift - left <= j <= i + shift + right (-1 = unbounded; causal sets right = 0); GQA: query head h reads
# key/value head h // (heads_q // heads_kv); a row that sees no key: out 0, lse -inf
def visible(Sq, Sk, causal=False, window=(-1, -1), xp=None):
    xp = cp if xp is None else xp
    left, right = (int(w) for w in window)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = xp.arange(Sq)[:, None] + (Sk - Sq)
    j = xp.arange(Sk)[None, :]
    ok = xp.ones((Sq, Sk), dtype=bool)
    if right >= 0:
        ok = ok & (j <= i + right)
    if left >= 0:
        ok = ok & (j >= i - left)
    return ok


class Ref:
    pass


def mm(a, b):
    """matmul that also handles an empty inner dimension (zeros)."""
    if a.shape[-1] == 0:
        return cp.zeros(a.shape[:-1] + b.shape[-1:], dtype=cp.float64)
    return cp.matmul(a, b)


def finmax(a):
    """max |a| over the finite elements (0 when none)."""
    if not a.size:
        return 0.0
    return float(cp.abs(cp.where(cp.isfinite(a), a, 0.0)).max())


def attn_ref(q, k, v, dt, causal=False, window=(-1, -1), scale=None, dout=None, lse_u=0.0):
    """float64 forward (and with ``dout`` the analytic gradients) with per-element tolerances for inputs of dtype
    ``dt``. ``lse_u``: relative rounding of the lse handed to the backward (when it is not float32)."""
    dt = np.dtype(dt)
    u = U[dt]
    q, k, v = (dev64(a) for a in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    g = Hq // Hkv if Hkv else 1
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    kr, vr = cp.repeat(k, g, axis=1), cp.repeat(v, g, axis=1)
    ok = visible(Sq, Sk, causal, window)
    R = Ref()
    R.scale, R.ok = sc, ok
    with np.errstate(all="ignore"):
        if Sk:
            s = cp.where(ok, mm(q, kr.swapaxes(-1, -2)) * sc, -cp.inf)
            m = s.max(axis=-1, keepdims=True)
            smax = cp.where(ok, mm(cp.abs(q), cp.abs(kr).swapaxes(-1, -2)), 0.0).max(axis=-1, keepdims=True)
        else:
            s = cp.zeros((B, Hq, Sq, 0))
            m = cp.full((B, Hq, Sq, 1), -cp.inf)
            smax = cp.zeros((B, Hq, Sq, 1))
        ms = cp.where(cp.isneginf(m), 0.0, m)
        e = cp.exp(s - ms)
        l = e.sum(axis=-1, keepdims=True)
        l1 = cp.where(l == 0, 1.0, l)
        P = e / l1
        out = mm(P, vr)
        lse = cp.where(l[..., 0] == 0, -cp.inf, ms[..., 0] + cp.log(l1[..., 0]))
        E = u + EPS32 * (8 * abs(sc) * smax + 4 * math.sqrt(max(Sk, 1)) + 8)
        pv = mm(P, cp.abs(vr))
        mo = finmax(out)
        R.out, R.lse, R.P = out, lse, P
        # float16 rounds P (and dS) below 2^-14 to subnormals: an absolute error of up to 2^-25 per element
        sub = 2.0 ** -25 if dt == F16 else 0.0
        okf = ok.astype(cp.float64)
        R.tol_out = 3 * E * pv + 2 * u * cp.abs(out) + FLOOR * mo + (3 * sub * mm(okf, cp.abs(vr)) if sub else 0.0)
        R.tol_lse = 1e-4 + 1e-6 * cp.abs(cp.where(cp.isfinite(lse), lse, 0.0)) + 8 * EPS32 * abs(sc) * smax[..., 0]
        if dout is None:
            return R
        do = dev64(dout)
        dP = mm(do, vr.swapaxes(-1, -2))
        Dv = (do * out).sum(axis=-1, keepdims=True)
        dS = P * (dP - Dv)
        dq = mm(dS, kr) * sc
        dk = (mm(dS.swapaxes(-1, -2), q) * sc).reshape(B, Hkv, g, Sk, D).sum(axis=2)
        dv = mm(P.swapaxes(-1, -2), do).reshape(B, Hkv, g, Sk, D).sum(axis=2)
        n = max(Sk, Sq * g, 1)
        lfin = cp.abs(cp.where(cp.isfinite(lse), lse, 0.0))[..., None]
        Eb = u + EPS32 * (8 * abs(sc) * smax + 8 * lfin + 4 * math.sqrt(n) + 8) + lse_u * lfin
        Dabs = (cp.abs(do) * (cp.abs(out) + pv)).sum(axis=-1, keepdims=True)
        A = P * (cp.abs(dP) + cp.abs(Dv))
        errdS = 2 * Eb * A + P * (4 * Eb * Dabs + 8 * EPS32 * mm(cp.abs(do), cp.abs(vr).swapaxes(-1, -2)))
        R.dq, R.dk, R.dv = dq, dk, dv
        okT = okf.swapaxes(-1, -2)
        R.tol_dq = 2 * abs(sc) * mm(errdS + sub * okf, cp.abs(kr)) + 2 * u * cp.abs(dq) + FLOOR * finmax(dq)
        R.tol_dk = (2 * abs(sc) * mm(errdS.swapaxes(-1, -2) + sub * okT, cp.abs(q))).reshape(B, Hkv, g, Sk, D).sum(
            axis=2) + 2 * u * cp.abs(dk) + FLOOR * finmax(dk)
        R.tol_dv = (2 * mm((Eb * P).swapaxes(-1, -2) + sub * okT, cp.abs(do))).reshape(B, Hkv, g, Sk, D).sum(axis=2) \
            + 2 * u * cp.abs(dv) + FLOOR * finmax(dv)
    return R


def meta(what, a, shape, dt, contiguous=False):
    if not isinstance(a, cp.ndarray):
        raise Fail(f"{what}: a {type(a).__name__}, expected a CuPy array")
    if tuple(a.shape) != tuple(shape) or np.dtype(a.dtype) != np.dtype(dt):
        raise Fail(f"{what}: {desc(a)}, expected shape {tuple(shape)} dtype {np.dtype(dt)}")
    if contiguous and not a.flags.c_contiguous:
        raise Fail(f"{what}: not C-contiguous (strides {a.strides}); the docstring says contiguous")


def fwd_check(what, R, q, k, v, dt, causal=False, window=(-1, -1), scale=None, **kw):
    """cuflash.attention(return_lse=True) against R; returns (out, lse)."""
    out, lse = cuflash.attention(q, k, v, causal=causal, window_size=window, softmax_scale=scale, return_lse=True,
                                 **kw)
    meta(f"{what} out", out, q.shape, dt, contiguous=True)
    meta(f"{what} lse", lse, q.shape[:3], F32)
    close(f"{what} out", out, R.out, R.tol_out)
    close(f"{what} lse", lse, R.lse, R.tol_lse)
    return out, lse


def bwd_check(what, R, grads, q, k, v, dt):
    for name, g, x, r, t in zip(("dq", "dk", "dv"), grads, (q, k, v), (R.dq, R.dk, R.dv),
                                (R.tol_dq, R.tol_dk, R.tol_dv)):
        if isinstance(g, cp.ndarray):
            meta(f"{what} {name}", g, x.shape, dt)
        close(f"{what} {name}", g, r, t)


def fwd_bwd_check(what, R, q, k, v, do, dt, causal=False, window=(-1, -1), scale=None, deterministic=False, **kw):
    out, lse = fwd_check(what, R, q, k, v, dt, causal, window, scale, **kw)
    grads = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, window_size=window,
                                       softmax_scale=scale, deterministic=deterministic)
    bwd_check(what, R, grads, q, k, v, dt)
    return out, lse, grads


def err_list(msg, key):
    """The Python list after ``key`` in an error message (the available tile configurations)."""
    m = re.search(re.escape(key) + r"\s*(\[[^\]]*\])", msg)
    if not m:
        raise Fail(f"no list after {key!r} in {msg[:200]!r}")
    return ast.literal_eval(m.group(1))


def setrow(buf16, off, row_u16):
    """Write a contiguous run of uint16 values at element offset ``off`` of a flat uint16 device buffer."""
    buf16[off:off + row_u16.size] = cp.asarray(row_u16)


# ------------------------------------------------------------------------------------------------------------
# 1. documented: rows that see no key output exactly 0 and lse -inf -- also when k / v hold NaN or inf elsewhere
@check("fwd_fully_masked_rows_exact_zero_with_nonfinite_k")
def _(c):
    """attention's docstring: 'a query row that sees no key outputs exactly 0 and its lse is -inf'. Non-finite
    values sit in keys those rows can never see (head 0: a NaN in k; head 1: +inf in a k row; head 2: NaN in k).
    Non-finite v is documented to reach rows sharing its K/V tile (P = 0 times NaN), as in FlashAttention: the
    first run of this probe (experiments/results/logs/newuser_attn_probe_182f276.txt) checked v too."""
    rng = rng_for(c.name)
    cases = [("causal Sq=70 > Sk=40", 70, 40, 64, True, (-1, -1)),
             ("window (0,0) Sq=200 > Sk=10", 200, 10, 64, False, (0, 0)),
             ("causal Sq=300 > Sk=100 d160", 300, 100, 160, True, (-1, -1))]
    for label, Sq, Sk, D, causal, window in cases:
        ok = cp.asnumpy(visible(Sq, Sk, causal, window))
        empty = ~ok.any(axis=1)
        for dt in (BF16, F32):
            (qh, kh, vh, _), _d = inputs(rng, dt, 1, 3, 3, Sq, Sk, D)
            kh[0, 0, 5, 3] = np.nan
            kh[0, 1, 7, :] = np.inf
            kh[0, 2, min(8, Sk - 1), 0] = np.nan
            q, k, v = (to_dev(h, dt) for h in (qh, kh, vh))
            for sch in SCHEDULES:
                with c.sub(f"{label} {dt} {sch}"):
                    out, lse = cuflash.attention(q, k, v, causal=causal, window_size=window, return_lse=True,
                                                 schedule=sch)
                    o, l = host64(out)[:, :, empty], host64(lse)[:, :, empty]
                    bad = []
                    for hd, what in ((0, "NaN in k"), (1, "inf in k"), (2, "NaN in k")):
                        nz = int(np.sum(~(o[0, hd] == 0)))
                        nl = int(np.sum(~np.isneginf(l[0, hd])))
                        if nz or nl:
                            kinds = sorted({"NaN" if np.isnan(x) else "inf" if np.isinf(x) else "nonzero"
                                            for x in o[0, hd][~(o[0, hd] == 0)]})
                            bad.append(f"head {hd} ({what}): {nz} of {o[0, hd].size} outputs not 0 ({kinds}), {nl} "
                                       f"lse not -inf")
                    if bad:
                        raise Fail(f"{int(empty.sum())} rows see no key; " + "; ".join(bad))


# 2. NaN / inf propagation, every schedule alike (the tests pin it for the FA-2 kernel: NaN in a query row poisons
#    that row and its lse; NaN in a key poisons the rows that see it)
@check("fwd_nonfinite_inputs_propagate_alike_on_every_schedule")
def _(c):
    rng = rng_for(c.name)
    for dt in (BF16, F32):
        for Sq, Sk, causal in ((100, 200, False), (150, 150, False)):  # unmasked: every row sees every key
            (qh, kh, vh, _), _d = inputs(rng, dt, 1, 3, 3, Sq, Sk, 64)
            qh[0, 0, 7, 3] = np.nan     # head 0: one query row
            kh[0, 1, 3, 5] = np.nan     # head 1: key 3 (in the first K tile; Sk spans several tiles)
            vh[0, 2, 3, 5] = np.nan     # head 2: one value element (column 5 of rows that see key 3)
            R = attn_ref(qh, kh, vh, dt, causal)
            q, k, v = (to_dev(h, dt) for h in (qh, kh, vh))
            for sch in SCHEDULES:
                with c.sub(f"{dt} {Sq}x{Sk} causal={causal} {sch}"):
                    out, lse = cuflash.attention(q, k, v, causal=causal, return_lse=True, schedule=sch)
                    close(f"{sch} out", out, R.out, R.tol_out)
                    close(f"{sch} lse", lse, R.lse, R.tol_lse)
    # softmax_scale=0: q·kᵀ·0 is NaN where q or k holds NaN or inf (IEEE, and the float64 reference); the Hopper path
    # replaces q by zeros for a zero scale (cuflash/_attention_sm90.py), the other schedules multiply
    (qh, kh, vh, _), _d = inputs(rng, BF16, 1, 2, 2, 100, 200, 64)
    qh[0, 0, 7, 3] = np.nan
    kh[0, 1, 3, 5] = np.inf
    R = attn_ref(qh, kh, vh, BF16, False, scale=0.0)
    q, k, v = (to_dev(h, BF16) for h in (qh, kh, vh))
    for sch in SCHEDULES:
        with c.sub(f"softmax_scale=0 with NaN in q / inf in k, bfloat16 {sch}"):
            out, lse = cuflash.attention(q, k, v, softmax_scale=0.0, return_lse=True, schedule=sch)
            close(f"{sch} out", out, R.out, R.tol_out)
            close(f"{sch} lse", lse, R.lse, R.tol_lse)


# 3. documented for the backward: 'lse -inf for a row that sees no key (its gradients are 0)'
@check("bwd_fully_masked_rows_zero_grad_with_nonfinite_k")
def _(c):
    rng = rng_for(c.name)
    Sq, Sk, D = 70, 40, 64
    empty = ~cp.asnumpy(visible(Sq, Sk, True)).any(axis=1)
    for dt in (BF16, F32):
        (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, 1, 2, 1, Sq, Sk, D)
        R = attn_ref(qh, kh, vh, dt, True)
        out, lse = to_dev(cp.asnumpy(R.out), dt), cp.asarray(cp.asnumpy(R.lse).astype(np.float32))
        # in q, of a row that sees keys (a NaN / inf in k or v is documented to reach dq of every row sharing its
        # tile through dS = 0 times K and P = 0 times V, as in FlashAttention: the run at efbe388 showed it for k)
        for bad_val in (np.nan, np.inf):
            qb = qh.copy()
            qb[0, 0, 50, 3] = bad_val  # row 50 sees keys 0..20
            for det in (False, True):
                with c.sub(f"{dt} q[row 50]={bad_val} deterministic={det}"):
                    dq, dk, dv = cuflash.attention_backward(do, to_dev(qb, dt), k, v, out, lse, causal=True,
                                                            deterministic=det)
                    g = host64(dq)[:, :, empty]
                    nz = int(np.sum(~(g == 0)))
                    if nz:
                        raise Fail(f"dq of the {int(empty.sum())} rows that see no key (lse -inf): {nz} of {g.size} "
                                   f"not 0 ({'NaN' if np.isnan(g).any() else 'finite nonzero'})")
        with c.sub(f"{dt} finite inputs (sanity)"):
            dq, dk, dv = cuflash.attention_backward(do, q, k, v, out, lse, causal=True)
            if np.any(host64(dq)[:, :, empty] != 0):
                raise Fail("dq of rows that see no key not 0 with finite inputs")


# 4. NOT documented, but implied by 'masked scores are -inf' and by tests/test_attention.py::test_case_causal_sq_lt_sk
#    (row 0 bitwise unchanged when a key it cannot see changes): a NaN / inf in a key a row cannot see (a future key,
#    a KV-cache slot outside the window) leaves that row finite and unchanged
@check("masked_keys_with_nonfinite_k_isolated")
def _(c):
    rng = rng_for(c.name)
    for dt in (BF16, F32):
        for label, Sq, Sk, causal, window, bad_key in (("causal", 100, 100, True, (-1, -1), 90),
                                                       ("sliding window (10, 0)", 100, 100, False, (10, 0), 2)):
            (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, 1, 2, 2, Sq, Sk, 64)
            ok = cp.asnumpy(visible(Sq, Sk, causal, window))
            blind = ~ok[:, bad_key]  # rows that cannot see the bad key
            vb, kb = vh.copy(), kh.copy()
            kb[0, 0, bad_key, :] = np.nan  # head 0: NaN key row (a NaN v row is documented to leak)
            kb[0, 1, bad_key, :] = np.inf  # head 1: +inf key row
            qd, kbd, vbd = q, to_dev(kb, dt), to_dev(vb, dt)
            for sch in SCHEDULES:
                with c.sub(f"{dt} {label} {sch}"):
                    o_ref = cuflash.attention(q, k, v, causal=causal, window_size=window, schedule=sch)
                    o_bad = cuflash.attention(qd, kbd, vbd, causal=causal, window_size=window, schedule=sch)
                    ob, orf = host64(o_bad)[:, :, blind], host64(o_ref)[:, :, blind]
                    nf = [int(np.sum(~np.isfinite(ob[0, h]))) for h in (0, 1)]
                    if any(nf):
                        raise Fail(f"{int(blind.sum())} rows cannot see key {bad_key}; non-finite outputs among them: "
                                   f"{nf[0]} (NaN k row, head 0), {nf[1]} (+inf k row, head 1) of {ob[0, 0].size}")
                    if not np.array_equal(ob, orf):
                        raise Fail("rows that cannot see the changed key changed value")
            # (no backward step: a NaN / inf in k or v is documented to reach dq of every row sharing its tile)


# 5. bad input: TypeError / ValueError naming the problem (README: 'before any launch')
@check("bad_inputs_raise_clear_errors")
def _(c):
    def z(shape, dt=F16):
        dt = np.dtype(dt)
        if dt == BF16:
            return cp.zeros(shape, dtype=cp.uint16).view(BF16)
        return cp.zeros(shape, dtype=dt)

    A = cuflash.attention
    G = cuflash.attention_backward
    q = z((2, 4, 8, 64))
    k = z((2, 2, 9, 64))
    lse = cp.zeros((2, 4, 8), cp.float32)
    E = expect_error
    cases = [
        ("q 3-D", ValueError, ["q", "shape"], A, (z((2, 8, 64)), k, k), {}),
        ("k 5-D", ValueError, ["k", "shape"], A, (q, z((2, 2, 9, 64, 1)), k), {}),
        ("q int32", TypeError, ["int32"], A, (z((2, 4, 8, 64), np.int32),) * 3, {}),
        ("q float64", TypeError, ["float64"], A, (z((2, 4, 8, 64), np.float64),) * 3, {}),
        ("q bool", TypeError, ["bool"], A, (z((2, 4, 8, 64), np.bool_),) * 3, {}),
        ("q complex64", TypeError, ["complex"], A, (z((2, 4, 8, 64), np.complex64),) * 3, {}),
        ("k bfloat16 with q float16", TypeError, ["dtype"], A, (q, z((2, 2, 9, 64), BF16), k), {}),
        ("v float32 with q, k float16", TypeError, ["dtype"], A, (q, k, z((2, 2, 9, 64), F32)), {}),
        ("k, v different seqlen", ValueError, ["k", "v"], A, (q, k, z((2, 2, 10, 64))), {}),
        ("k, v different head_dim", ValueError, ["k", "v"], A, (q, k, z((2, 2, 9, 32))), {}),
        ("batch mismatch", ValueError, ["batch"], A, (q, z((3, 2, 9, 64)), z((3, 2, 9, 64))), {}),
        ("head_dim mismatch q/k", ValueError, ["head_dim"], A, (q, z((2, 2, 9, 32)), z((2, 2, 9, 32))), {}),
        ("heads_q 4 / heads_kv 3", ValueError, ["heads"], A, (q, z((2, 3, 9, 64)), z((2, 3, 9, 64))), {}),
        ("heads_kv > heads_q", ValueError, ["heads"], A, (z((2, 2, 8, 64)), z((2, 4, 9, 64)), z((2, 4, 9, 64))), {}),
        ("heads_kv 0", ValueError, ["heads"], A, (z((2, 0, 8, 64)), z((2, 0, 9, 64)), z((2, 0, 9, 64))), {}),
        ("head_dim 0", ValueError, ["head_dim"], A, (z((1, 1, 8, 0)),) * 3, {}),
        ("head_dim 257", ValueError, ["head_dim", "256"], A, (z((1, 1, 8, 257)),) * 3, {}),
        ("head_dim 512", ValueError, ["head_dim", "256"], A, (z((1, 1, 8, 512)),) * 3, {}),
        ("host numpy q", TypeError, ["q", "host|GPU"], A, (np.zeros((2, 4, 8, 64), np.float16), k, k), {}),
        ("host numpy v", TypeError, ["v"], A, (q, k, np.zeros((2, 2, 9, 64), np.float16)), {}),
        ("python list q", TypeError, ["q"], A, ([[1.0]], k, k), {}),
        ("causal='yes'", TypeError, ["causal"], A, (q, k, k), {"causal": "yes"}),
        ("causal=None", TypeError, ["causal"], A, (q, k, k), {"causal": None}),
        ("causal=2", TypeError, ["causal"], A, (q, k, k), {"causal": 2}),
        ("return_lse='no'", TypeError, ["return_lse"], A, (q, k, k), {"return_lse": "no"}),
        ("softmax_scale='0.1'", TypeError, ["softmax_scale"], A, (q, k, k), {"softmax_scale": "0.1"}),
        ("softmax_scale=1j", TypeError, ["softmax_scale"], A, (q, k, k), {"softmax_scale": 1j}),
        ("softmax_scale=True", TypeError, ["softmax_scale"], A, (q, k, k), {"softmax_scale": True}),
        ("softmax_scale=nan", ValueError, ["softmax_scale"], A, (q, k, k), {"softmax_scale": float("nan")}),
        ("softmax_scale=inf", ValueError, ["softmax_scale"], A, (q, k, k), {"softmax_scale": float("inf")}),
        ("softmax_scale=1e39", ValueError, ["softmax_scale"], A, (q, k, k), {"softmax_scale": 1e39}),
        ("softmax_scale 0-d CuPy array", TypeError, ["softmax_scale"], A, (q, k, k),
         {"softmax_scale": cp.asarray(0.125)}),
        ("window_size=(1,)", ValueError, ["window_size"], A, (q, k, k), {"window_size": (1,)}),
        ("window_size=(1,2,3)", ValueError, ["window_size"], A, (q, k, k), {"window_size": (1, 2, 3)}),
        ("window_size=(-2,0)", ValueError, ["window_size"], A, (q, k, k), {"window_size": (-2, 0)}),
        ("window_size=(1.5,0)", TypeError, ["window_size"], A, (q, k, k), {"window_size": (1.5, 0)}),
        ("window_size=None", TypeError, ["window_size"], A, (q, k, k), {"window_size": None}),
        ("window_size=5", TypeError, ["window_size"], A, (q, k, k), {"window_size": 5}),
        ("window_size='ab'", TypeError, ["window_size"], A, (q, k, k), {"window_size": "ab"}),
        ("schedule='FA2'", ValueError, ["schedule"], A, (q, k, k), {"schedule": "FA2"}),
        ("schedule=None", ValueError, ["schedule"], A, (q, k, k), {"schedule": None}),
        ("wgmma with float32", ValueError, ["wgmma"], A, (z((1, 1, 8, 64), F32),) * 3, {"schedule": "wgmma"}),
        ("wgmma with head_dim 160", ValueError, ["head_dim"], A, (z((1, 1, 8, 160)),) * 3, {"schedule": "wgmma"}),
        ("block_sizes=(96,64)", ValueError, ["block_sizes|Br=96"], A, (q, k, k), {"block_sizes": (96, 64)}),
        ("block_sizes='garbage'", ValueError, ["block_sizes"], A, (q, k, k), {"block_sizes": "garbage"}),
        ("block_sizes=(128.0,64.0)", ValueError, ["block_sizes"], A, (q, k, k), {"block_sizes": (128.0, 64.0)}),
        ("block_sizes=(128,)", ValueError, ["block_sizes"], A, (q, k, k), {"block_sizes": (128,)}),
        ("wgmma block_sizes=(128,128,4)", ValueError, ["block_sizes"], A, (q, k, k),
         {"schedule": "wgmma", "block_sizes": (128, 128, 4)}),
        ("fa1 block_sizes=(128,128)", ValueError, ["block_sizes|Br=128"], A, (q, k, k),
         {"schedule": "fa1", "block_sizes": (128, 128)}),
        ("float16 block_sizes of a bfloat16-only tile (64,64)", ValueError, ["block_sizes|Br=64"], A, (q, k, k),
         {"schedule": "fa2", "block_sizes": (64, 64)}),
        ("batch 65536", ValueError, ["65535"], A, (z((65536, 1, 1, 64)),) * 3, {}),
        ("heads 65536", ValueError, ["65535"], A, (z((1, 65536, 1, 64)), z((1, 1, 1, 64)), z((1, 1, 1, 64))), {}),
        # backward
        ("bwd dout float32", TypeError, ["dout"], G, (z((2, 4, 8, 64), F32), q, k, k, q, lse), {}),
        ("bwd out bfloat16", TypeError, ["out"], G, (q, q, k, k, z((2, 4, 8, 64), BF16), lse), {}),
        ("bwd dout wrong seqlen", ValueError, ["dout"], G, (z((2, 4, 7, 64)), q, k, k, q, lse), {}),
        ("bwd out wrong head_dim", ValueError, ["out"], G, (q, q, k, k, z((2, 4, 8, 32)), lse), {}),
        ("bwd out wrong heads", ValueError, ["out"], G, (q, q, k, k, z((2, 2, 8, 64)), lse), {}),
        ("bwd lse int32", TypeError, ["lse"], G, (q, q, k, k, q, lse.astype(cp.int32)), {}),
        ("bwd lse complex64", TypeError, ["lse"], G, (q, q, k, k, q, lse.astype(cp.complex64)), {}),
        ("bwd lse (B, Hq)", ValueError, ["lse"], G, (q, q, k, k, q, lse[:, :, 0]), {}),
        ("bwd lse (B, Hq, Sq, 1)", ValueError, ["lse"], G, (q, q, k, k, q, lse[..., None]), {}),
        ("bwd lse (B, Hkv, Sq)", ValueError, ["lse"], G, (q, q, k, k, q, lse[:, :2]), {}),
        ("bwd lse numpy", TypeError, ["lse"], G, (q, q, k, k, q, np.zeros((2, 4, 8), np.float32)), {}),
        ("bwd out tuple (out, lse) by mistake", TypeError, ["out"], G, (q, q, k, k, (q, lse), lse), {}),
        ("bwd dout numpy", TypeError, ["dout"], G, (np.zeros((2, 4, 8, 64), np.float16), q, k, k, q, lse), {}),
        ("bwd deterministic='yes'", TypeError, ["deterministic"], G, (q, q, k, k, q, lse), {"deterministic": "yes"}),
        ("bwd deterministic=None", TypeError, ["deterministic"], G, (q, q, k, k, q, lse), {"deterministic": None}),
        ("bwd block_sizes=(64,32)", ValueError, ["block_sizes"], G, (q, q, k, k, q, lse), {"block_sizes": (64, 32)}),
        ("bwd block_sizes=(64,64,4)", ValueError, ["block_sizes"], G, (q, q, k, k, q, lse),
         {"block_sizes": (64, 64, 4)}),
        ("bwd k/v heads 3 with heads_q 4", ValueError, ["heads"], G,
         (q, q, z((2, 3, 9, 64)), z((2, 3, 9, 64)), q, lse), {}),
        ("bwd causal='no'", TypeError, ["causal"], G, (q, q, k, k, q, lse), {"causal": "no"}),
        ("bwd softmax_scale='x'", TypeError, ["softmax_scale"], G, (q, q, k, k, q, lse), {"softmax_scale": "x"}),
        ("bwd window (0,-2)", ValueError, ["window_size"], G, (q, q, k, k, q, lse), {"window_size": (0, -2)}),
        ("bwd head_dim 300", ValueError, ["head_dim"], G,
         (z((1, 1, 4, 300)),) * 5 + (cp.zeros((1, 1, 4), cp.float32),), {}),
        ("bwd batch 65536", ValueError, ["65535"], G, (z((65536, 1, 1, 64)),) * 5 + (cp.zeros((65536, 1, 1),
                                                                                             cp.float32),), {}),
    ]
    for label, exc, words, fn, args, kw in cases:
        with c.sub(label):
            E(label, exc, words, fn, *args, **kw)
    if torch is not None:
        with c.sub("torch CPU tensor (a host array)"):
            t = torch.zeros((2, 4, 8, 64), dtype=torch.float16)
            E("torch CPU q", TypeError, ["q"], A, t, t, t)
        if TDEV == "cuda":
            with c.sub("torch CUDA tensor with requires_grad=True"):
                t = torch.zeros((1, 1, 8, 64), dtype=torch.float16, device="cuda", requires_grad=True)
                E("requires_grad q", TypeError, ["q"], A, t, t.detach(), t.detach())
    with c.sub("accepted forms (documented): np.bool_ causal, numpy / ml_dtypes scalar scales, list window"):
        x = to_dev(rng_for("acc").standard_normal((1, 2, 33, 64)), F16)
        ref = cuflash.attention(x, x, x, causal=True, softmax_scale=0.25, window_size=(4, 0))
        for kw in ({"causal": np.bool_(True), "softmax_scale": np.float32(0.25), "window_size": [4, 0]},
                   {"causal": 1, "softmax_scale": ml_dtypes.bfloat16(0.25), "window_size": (np.int64(4), 0)},
                   {"causal": True, "softmax_scale": np.float16(0.25), "window_size": np.array([4, 0])}):
            same_bits(f"{kw}", cuflash.attention(x, x, x, **kw), ref)


# 6. the backward's lse in other dtypes (documented: converted), lse / dout / out layouts
@check("bwd_lse_dtypes_and_dout_out_layouts")
def _(c):
    rng = rng_for(c.name)
    for dt, D in ((BF16, 64), (F16, 128), (F32, 64)):
        B, Hq, Hkv, Sq, Sk = 2, 4, 2, 97, 131
        (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, B, Hq, Hkv, Sq, Sk, D)
        R = attn_ref(qh, kh, vh, dt, True, dout=doh)
        out, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
        g0 = None
        with c.sub(f"{dt} d{D} baseline (float32 lse, deterministic)"):
            g0 = cuflash.attention_backward(do, q, k, v, out, lse, causal=True, deterministic=True)
            bwd_check("baseline", R, g0, q, k, v, dt)

        def same(label, grads):
            if g0 is None:
                raise Fail("baseline failed")
            for n, a, b in zip(("dq", "dk", "dv"), grads, g0):
                same_bits(f"{label} {n}", a, b)

        variants = [
            ("lse float64 (exact)", lambda: lse.astype(cp.float64)),
            ("lse transposed storage (B, Sq, Hq)", lambda: cp.ascontiguousarray(lse.transpose(0, 2, 1)).transpose(0, 2, 1)),
            ("lse every other element of a buffer", lambda: cp.repeat(lse, 2, axis=2)[:, :, ::2]),
            ("lse negative strides", lambda: cp.ascontiguousarray(lse[::-1, ::-1, ::-1])[::-1, ::-1, ::-1]),
        ]
        for label, mk in variants:
            with c.sub(f"{dt} d{D} {label}"):
                same(label, cuflash.attention_backward(do, q, k, v, out, mk(), causal=True, deterministic=True))
        with c.sub(f"{dt} d{D} out in (B, S, H, D) storage, dout with a non-unit last stride"):
            out_b = copy_into_layout(out, (0, 2, 1, 3))
            wide = cp.zeros(do.shape[:-1] + (2 * D,), dtype=bits16(do).dtype)
            wide[..., ::2] = bits16(do)
            do_s = wide[..., ::2].view(dt)
            same("strided out / dout", cuflash.attention_backward(do_s, q, k, v, out_b, lse, causal=True,
                                                                  deterministic=True))
        for ldt in (F16, BF16):
            with c.sub(f"{dt} d{D} lse {ldt} (documented: converted)"):
                lse_h = cp.asnumpy(lse).astype(ldt)
                lse_l = to_dev(lse_h.astype(np.float64), ldt)
                R2 = attn_ref(qh, kh, vh, dt, True, dout=doh, lse_u=U[ldt])
                bwd_check(f"lse {ldt}", R2, cuflash.attention_backward(do, q, k, v, out, lse_l, causal=True), q, k,
                          v, dt)
        with c.sub(f"{dt} d{D} dout broadcast (zero strides: torch's grad of out.sum())"):
            row_h = rounded(rng.standard_normal((1, 1, 1, D)), dt)
            do_b = cp.broadcast_to(to_dev(row_h, dt), do.shape)
            R3 = attn_ref(qh, kh, vh, dt, True, dout=np.broadcast_to(row_h, do.shape))
            bwd_check("broadcast dout", R3, cuflash.attention_backward(do_b, q, k, v, out, lse, causal=True), q, k,
                      v, dt)
        with c.sub(f"{dt} d{D} dout with negative strides"):
            do_n = copy_into_layout(do, (0, 1, 2, 3))[:, ::-1, ::-1]
            R4 = attn_ref(qh, kh, vh, dt, True, dout=doh[:, ::-1, ::-1])
            bwd_check("negative dout", R4, cuflash.attention_backward(do_n, q, k, v, out, lse, causal=True), q, k,
                      v, dt)


# 7. backward (and forward) with one-sided / zero windows, scales incl. 0 and negative, GQA ratios, Sq != Sk
@check("bwd_windows_scales_gqa_vs_float64")
def _(c):
    rng = rng_for(c.name)
    cfgs = [  # dt, B, Hq, Hkv, Sq, Sk, D, causal, window, scale, deterministic
        (BF16, 1, 4, 1, 150, 333, 64, False, (5, -1), None, False),
        (BF16, 1, 6, 2, 333, 150, 128, False, (-1, 3), None, True),
        (BF16, 2, 3, 3, 200, 77, 64, False, (0, 0), None, False),
        (F16, 1, 8, 1, 129, 257, 64, True, (16, 7), -0.3, False),
        (BF16, 1, 2, 1, 64, 300, 128, False, (-1, -1), 0.0, False),
        (BF16, 1, 7, 1, 100, 100, 64, True, (-1, -1), 2.5, True),
        (BF16, 1, 2, 2, 1000, 1, 64, False, (-1, -1), None, False),
        (BF16, 1, 2, 1, 1, 1000, 128, True, (30, -1), None, True),
        (F16, 1, 4, 2, 65, 63, 64, False, (0, -1), 1e-3, True),
        (F32, 1, 4, 2, 90, 130, 64, False, (10, 20), -1.0, False),
        (F32, 1, 2, 2, 1, 300, 32, True, (-1, -1), None, False),
        (F32, 1, 3, 1, 200, 70, 64, True, (3, 0), 0.0, True),
    ]
    for (dt, B, Hq, Hkv, Sq, Sk, D, causal, window, scale, det) in cfgs:
        label = f"{dt} {B}x{Hq}/{Hkv} {Sq}x{Sk} d{D} causal={causal} window={window} scale={scale} det={det}"
        with c.sub(label):
            (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, B, Hq, Hkv, Sq, Sk, D)
            R = attn_ref(qh, kh, vh, dt, causal, window, scale, dout=doh)
            fwd_bwd_check(label, R, q, k, v, do, dt, causal, window, scale, deterministic=det)


# 8. the README's API tour (attention lines), as written, checked against float64 on two (batch, head) pairs
@check("readme_api_tour_attention")
def _(c):
    B, H, N, D = (1, 2, 256, 128) if SMALL else (2, 16, 4096, 128)
    st = {}
    with c.sub("README code as written"):
        q, k, v = (cp.random.standard_normal((B, H, N, D), dtype=cp.float32).astype(cuflash.bfloat16)
                   for _ in range(3))
        out, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)       # exact attention
        dq, dk, dv = cuflash.attention_backward(cp.ones_like(out), q, k, v, out, lse, causal=True)
        out_fa1 = cuflash.attention(q, k, v, causal=True, schedule="fa1")            # FA-1 schedule, for study
        out_std = cuflash.attention(q, k, v, causal=True, schedule="standard")       # S and P in HBM
        st.update(q=q, k=k, v=v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, out_fa1=out_fa1, out_std=out_std)
    if not st:
        return
    with c.sub("shapes and dtypes"):
        for n in ("out", "dq", "dk", "dv", "out_fa1", "out_std"):
            meta(n, st[n], (B, H, N, D), BF16)
        meta("lse", st["lse"], (B, H, N), F32)
    for b, h in ((0, 0), (B - 1, H - 1)):
        with c.sub(f"(batch {b}, head {h}) against float64"):
            sl = (slice(b, b + 1), slice(h, h + 1))
            R = attn_ref(st["q"][sl], st["k"][sl], st["v"][sl], BF16, True, dout=np.ones((1, 1, N, D)))
            close("out", st["out"][sl], R.out, R.tol_out)
            close("lse", st["lse"][sl], R.lse, R.tol_lse)
            close("out fa1", st["out_fa1"][sl], R.out, R.tol_out)
            close("out standard", st["out_std"][sl], R.out, R.tol_out)
            bwd_check("grads", R, (st["dq"][sl], st["dk"][sl], st["dv"][sl]), st["q"][sl], st["k"][sl],
                      st["v"][sl], BF16)


# ------------------------------------------------------------------------------------------------------------
# torch: the README's autograd Function and torch SDPA
def load_example():
    path = ROOT / "experiments" / "torch_autograd_example.py"
    spec = importlib.util.spec_from_file_location("torch_autograd_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TDT = {}


def tdtype(dt):
    if not TDT:
        TDT.update({F16: torch.float16, BF16: torch.bfloat16, F32: torch.float32})
    return TDT[np.dtype(dt)]


def tt(h, dt, requires_grad=False):
    t = torch.tensor(np.ascontiguousarray(h), dtype=torch.float64, device=TDEV).to(tdtype(dt))
    return t.requires_grad_(requires_grad)


def sdpa64(qh, kh, vh, doh=None, causal=False, window=(-1, -1), scale=None, topleft=False, gqa="repeat"):
    """torch SDPA in float64 (math backend) and its autograd gradients, as NumPy arrays."""
    q, k, v = (torch.tensor(np.ascontiguousarray(a), dtype=torch.float64, device=TDEV).requires_grad_()
               for a in (qh, kh, vh))
    Sq, Sk = q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    kw = {}
    if scale is not None:
        kw["scale"] = float(scale)
    kk, vv = k, v
    if g > 1:
        if gqa == "enable_gqa":
            kw["enable_gqa"] = True
        else:
            kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (causal_lower_right warns of NaN rows when seqlen_q > seqlen_k)
        if tuple(window) == (-1, -1) and causal and (Sq == Sk or topleft):
            kw["is_causal"] = True
        elif tuple(window) == (-1, -1) and causal and causal_lower_right is not None:
            kw["attn_mask"] = causal_lower_right(Sq, Sk)
        elif causal or tuple(window) != (-1, -1):
            kw["attn_mask"] = torch.from_numpy(visible(Sq, Sk, causal, window, xp=np)).to(TDEV)
        o = TF.scaled_dot_product_attention(q, kk, vv, **kw)
    res = [o.detach().cpu().numpy()]
    if doh is not None:
        (o * torch.tensor(np.ascontiguousarray(doh), dtype=torch.float64, device=TDEV)).sum().backward()
        res += [t.grad.detach().cpu().numpy() for t in (q, k, v)]
    return res


def agree(what, ours, theirs, rows=None, rtol=1e-9):
    """The probe's float64 reference against torch's float64 (a disagreement is a probe bug or a semantics gap)."""
    a, b = host64(ours), np.asarray(theirs, np.float64)
    if rows is not None:
        a, b = a[:, :, rows], b[:, :, rows]
    d = float(np.max(np.abs(a - b), initial=0.0))
    s = float(np.max(np.abs(b), initial=0.0))
    if not d <= rtol * max(s, 1.0):
        raise Fail(f"{what}: the probe's float64 reference and torch SDPA float64 differ by {d:.3g} (max |x| {s:.3g})")


@check("torch_readme_autograd_function", torch_needed=True)
def _(c):
    ex = None
    with c.sub("load experiments/torch_autograd_example.py (the README snippet)"):
        ex = load_example()
        for n in ("to_cupy", "to_torch", "FlashAttention", "flash_attention"):
            if not hasattr(ex, n):
                raise Fail(f"no {n}")
    if ex is None:
        return
    rng = rng_for(c.name)
    cfgs = [  # dt, B, Hq, Hkv, Sq, Sk, D, causal, window, scale, loss, layout
        (BF16, 2, 8, 2, 300, 517, 64, True, (-1, -1), None, "sum", "bhsd"),
        (F16, 1, 4, 4, 256, 256, 128, False, (32, 0), 0.2, "w", "bhsd"),
        (F32, 1, 2, 1, 130, 70, 64, True, (-1, -1), None, "w", "bhsd"),
        (BF16, 2, 4, 4, 200, 200, 64, True, (-1, -1), None, "sum", "bshd"),
        (BF16, 1, 4, 2, 100, 180, 128, False, (-1, -1), -0.5, "w", "torch-stream"),
    ]
    for (dt, B, Hq, Hkv, Sq, Sk, D, causal, window, scale, loss, layout) in cfgs:
        label = f"{dt} {Hq}/{Hkv} {Sq}x{Sk} d{D} causal={causal} window={window} scale={scale} {loss} {layout}"
        with c.sub(label):
            (qh, kh, vh, wh), _d = inputs(rng, dt, B, Hq, Hkv, Sq, Sk, D)
            if layout == "bshd":
                leaves = [tt(h.transpose(0, 2, 1, 3), dt, True) for h in (qh, kh, vh)]
                q, k, v = (t.transpose(1, 2) for t in leaves)
            else:
                leaves = [tt(h, dt, True) for h in (qh, kh, vh)]
                q, k, v = leaves
            ctx = contextlib.nullcontext()
            if layout == "torch-stream" and TDEV == "cuda":
                ts = torch.cuda.Stream()
                ts.wait_stream(torch.cuda.current_stream())
                ctx = torch.cuda.stream(ts)
            with ctx:
                o = ex.flash_attention(q, k, v, causal=causal, softmax_scale=scale, window_size=window)
                if loss == "sum":
                    o.sum().backward()
                    doh = np.ones_like(qh)
                else:
                    (o * tt(wh, dt)).sum().backward()
                    doh = wh
            if TDEV == "cuda":
                torch.cuda.synchronize()
            grads = [t.grad.transpose(1, 2) if layout == "bshd" else t.grad for t in leaves]
            R = attn_ref(qh, kh, vh, dt, causal, window, scale, dout=doh)
            close("out", o, R.out, R.tol_out)
            for n, gg, r, tol in zip(("dq", "dk", "dv"), grads, (R.dq, R.dk, R.dv), (R.tol_dq, R.tol_dk, R.tol_dv)):
                if gg.dtype != tdtype(dt):
                    raise Fail(f"{n} dtype {gg.dtype}")
                close(n, gg, r, tol)
            rows = cp.asnumpy(R.ok).any(axis=1)
            so, sdq, sdk, sdv = sdpa64(qh, kh, vh, doh, causal, window, scale)
            agree("out", R.out, so, rows)
            agree("dq", R.dq, sdq, rows)
            if rows.all():
                agree("dk", R.dk, sdk)
                agree("dv", R.dv, sdv)
    with c.sub("attention_bwd module docstring: its pointer to the runnable example"):
        # since eae4360 the docstring names experiments/torch_autograd_example.py (README's version) instead of
        # keeping its own copy of the Function; the example itself is run just below
        doc = sys.modules["cuflash.attention_bwd"].__doc__
        if "experiments/torch_autograd_example.py" not in doc:
            raise Fail("cuflash/attention_bwd.py's docstring names no runnable example")
        if not os.path.exists(os.path.join(ROOT, "experiments", "torch_autograd_example.py")):
            raise Fail("experiments/torch_autograd_example.py, named by the docstring, does not exist")
    if TDEV == "cuda":
        for argv in (["--causal"], ["--dtype", "float16", "--shape", "1", "4", "1", "333", "64"],
                     ["--dtype", "float32", "--causal", "--shape", "1", "2", "2", "200", "96"]):
            with c.sub(f"torch_autograd_example.main({argv})"):
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    rc = ex.main(argv)
                if rc != 0 or "OK" not in buf.getvalue():
                    raise Fail(f"rc {rc}: {' | '.join(buf.getvalue().split(chr(10)))}")


@check("torch_sdpa_semantics_and_gradients", torch_needed=True)
def _(c):
    """cuflash against torch SDPA float64: bottom-right causal = causal_lower_right (not is_causal when Sq != Sk),
    GQA = enable_gqa, softmax_scale = scale (0 and negative too); fully masked rows: cuflash documents 0 / -inf."""
    rng = rng_for(c.name)
    cfgs = [  # dt, Hq, Hkv, Sq, Sk, D, causal, window, scale
        (BF16, 8, 2, 256, 256, 64, True, (-1, -1), None),
        (BF16, 4, 4, 100, 300, 64, True, (-1, -1), None),
        (F16, 4, 1, 300, 100, 128, True, (-1, -1), None),
        (BF16, 2, 2, 200, 260, 128, False, (32, 8), 0.2),
        (F16, 4, 2, 150, 150, 64, False, (-1, -1), -0.5),
        (BF16, 2, 1, 77, 99, 64, True, (-1, -1), 0.0),
        (F32, 3, 1, 120, 200, 40, True, (-1, -1), 0.3),
    ]
    for (dt, Hq, Hkv, Sq, Sk, D, causal, window, scale) in cfgs:
        label = f"{dt} {Hq}/{Hkv} {Sq}x{Sk} d{D} causal={causal} window={window} scale={scale}"
        with c.sub(label):
            (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, 1, Hq, Hkv, Sq, Sk, D)
            R = attn_ref(qh, kh, vh, dt, causal, window, scale, dout=doh)
            rows = cp.asnumpy(R.ok).any(axis=1)
            so, sdq, sdk, sdv = sdpa64(qh, kh, vh, doh, causal, window, scale)
            agree("out vs torch", R.out, so, rows)
            agree("dq vs torch", R.dq, sdq, rows)
            agree("dk vs torch", R.dk, sdk)
            agree("dv vs torch", R.dv, sdv)
            if Hq != Hkv and tuple(window) == (-1, -1) and (not causal or Sq == Sk):
                agree("out vs torch enable_gqa", R.out, sdpa64(qh, kh, vh, None, causal, window, scale,
                                                                gqa="enable_gqa")[0], rows)
            fwd_bwd_check(label, R, q, k, v, do, dt, causal, window, scale)
            if not rows.all():
                c.note(f"torch gives {np.unique(np.round(so[:, :, ~rows], 6))[:3]} on fully masked rows")
        if causal and Sq != Sk:
            with c.sub(f"{label}: cuflash's causal is NOT torch's is_causal (top-left) for Sq != Sk"):
                tl = sdpa64(qh, kh, vh, None, True, (-1, -1), scale, topleft=True)[0]
                out = host64(cuflash.attention(q, k, v, causal=True, softmax_scale=scale))
                both = rows & np.isfinite(tl).all(axis=(0, 1, 3))
                if not both.any():
                    raise Skip(f"torch's is_causal output is not finite here (scale={scale}: a torch quirk)")
                d_br = float(np.abs(out[:, :, both] - host64(R.out)[:, :, both]).max())
                d_tl = float(np.abs(out[:, :, both] - tl[:, :, both]).max())
                if not d_tl > 10 * d_br:
                    raise Fail(f"cuflash causal is as close to top-left ({d_tl:.3g}) as to bottom-right ({d_br:.3g})")
    with c.sub("low-precision torch SDPA error vs cuflash error (bf16 causal 1024, d128; informational ratio)"):
        (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, BF16, 1, 4, 4, 1024, 1024, 128)
        R = attn_ref(qh, kh, vh, BF16, True)
        ours = float(np.abs(host64(cuflash.attention(q, k, v, causal=True)) - host64(R.out)).max())
        with torch.no_grad():
            tq, tk, tv = (tt(h, BF16) for h in (qh, kh, vh))
            theirs = float(np.abs(host64(TF.scaled_dot_product_attention(tq, tk, tv, is_causal=True))
                                  - host64(R.out)).max())
        c.note(f"max abs err cuflash {ours:.3g} vs torch bf16 SDPA {theirs:.3g}")
        if ours > 2 * theirs + 1e-5:
            raise Fail(f"cuflash error {ours:.3g} > 2 x torch's {theirs:.3g} + 1e-5 (FlashAttention's test rule)")


# ------------------------------------------------------------------------------------------------------------
@check("layouts_views_strides_fwd_bwd")
def _(c):
    rng = rng_for(c.name)

    def case(label, dt, q, k, v, do, causal=True, window=(-1, -1), order_check=False):
        with c.sub(label):
            R = attn_ref(q, k, v, dt, causal, window, dout=do)
            out, lse, grads = fwd_bwd_check(label, R, q, k, v, do, dt, causal, window)
            if order_check:  # docstring: a (batch, seqlen, heads, head_dim) view gets a gradient of the same kind
                for n, g in zip(("dq", "dk", "dv"), grads):
                    if not g.strides[2] > g.strides[1]:
                        raise Fail(f"{n} strides {g.strides}: not in the (B, S, H, D) memory order of its input")
            grads_d = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, window_size=window,
                                                 deterministic=True)
            bwd_check(label + " deterministic", R, grads_d, q, k, v, dt)

    for dt, D in ((BF16, 64), (F16, 128), (F32, 64)):
        B, Hq, Hkv, S = 2, 4, 2, 131
        (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, B, Hq, Hkv, S, S, D)
        case(f"{dt} d{D} contiguous", dt, q, k, v, do)
        case(f"{dt} d{D} (B, S, H, D) views", dt, *(copy_into_layout(a, (0, 2, 1, 3)) for a in (q, k, v, do)),
             order_check=True)
        # packed qkv (batch, seqlen, heads_q + 2 heads_kv, head_dim), FlashAttention's qkvpacked layout with GQA
        packed = cp.concatenate([bits16(a).transpose(0, 2, 1, 3) for a in (q, k, v)], axis=2)
        qp, kp, vp = (packed[:, :, a:b].view(dt).transpose(0, 2, 1, 3)
                      for a, b in ((0, Hq), (Hq, Hq + Hkv), (Hq + Hkv, Hq + 2 * Hkv)))
        case(f"{dt} d{D} packed qkv slices", dt, qp, kp, vp, do)
        case(f"{dt} d{D} negative strides (heads and seq of q, batch of k, seq of v, all of dout)", dt,
             q[:, ::-1, ::-1], k[::-1], v[:, :, ::-1], do[::-1, ::-1, ::-1])
        # zero strides: one query row broadcast over seq, k broadcast over batch, v over heads
        qb = cp.broadcast_to(q[:, :, :1], q.shape)
        kb = cp.broadcast_to(k[:1], k.shape)
        vb = cp.broadcast_to(v[:, :1], v.shape)
        case(f"{dt} d{D} zero (broadcast) strides", dt, qb, kb, vb, do, causal=False)
        # k with overlapping rows: row stride 8 elements (16 bytes) over a flat buffer
        flat_h = rounded(rng.standard_normal(B * Hkv * (S * 8 + D)), dt)
        flat = to_dev(flat_h, dt)
        it = flat.itemsize
        ko = cp.lib.stride_tricks.as_strided(flat, (B, Hkv, S, D), ((Hkv * (S * 8 + D)) * it, (S * 8 + D) * it,
                                                                  8 * it, it))
        case(f"{dt} d{D} k with overlapping rows (row stride 16 bytes)", dt, q, ko, v, do, causal=False)
        # every tensor its own layout; head_dim with a non-unit stride (a copy)
        wide = cp.zeros(v.shape[:-1] + (D + 8,), dtype=bits16(v).dtype)
        wide[..., :D] = bits16(v)
        v_pad = wide[..., :D].view(dt)
        big = cp.zeros(q.shape[:-1] + (2 * D,), dtype=bits16(q).dtype)
        big[..., ::2] = bits16(q)
        q_step = big[..., ::2].view(dt)
        case(f"{dt} d{D} mixed: q head_dim stride 2, k (B,S,H,D) view, v padded rows, dout reversed seq", dt,
             q_step, copy_into_layout(k, (0, 2, 1, 3)), v_pad, do[:, :, ::-1], window=(20, 0))


@check("head_dims_around_native_fwd_bwd")
def _(c):
    """Documented: head_dim 1..256 (32, 64, 96, 128, 256 native; the Hopper kernel 64 and 128; others zero-padded,
    the default scale 1/sqrt of the caller's head_dim); > 256 raises."""
    rng = rng_for(c.name)
    plan = [(BF16, d, True) for d in (1, 8, 17, 40, 63, 64, 65, 80, 96, 100, 112, 128, 160, 192, 255, 256)] + \
        [(F16, d, True) for d in (8, 65, 160, 256)] + [(F32, d, d in (1, 160, 256)) for d in (1, 63, 160, 256)]
    for dt, D, bwd in plan:
        with c.sub(f"{dt} head_dim {D}" + (" fwd+bwd" if bwd else " fwd")):
            (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, 1, 4, 2, 77, 130, D)
            R = attn_ref(qh, kh, vh, dt, True, dout=doh if bwd else None)
            if bwd:
                fwd_bwd_check(f"d{D}", R, q, k, v, do, dt, True, deterministic=D % 2 == 1)
            else:
                fwd_check(f"d{D}", R, q, k, v, dt, True)
    for D in (100, 128):
        with c.sub(f"schedule='wgmma' explicit head_dim {D} (bfloat16)"):
            if not is_sm90():
                raise Skip("not compute capability 9.0")
            (qh, kh, vh, _), (q, k, v, _d) = inputs(rng, BF16, 1, 2, 2, 90, 150, D)
            fwd_check(f"wgmma d{D}", attn_ref(qh, kh, vh, BF16, False), q, k, v, BF16, schedule="wgmma")


@check("nondefault_streams_fwd_bwd")
def _(c):
    rng = rng_for(c.name)
    dt = BF16
    (qh, kh, vh, doh), _d = inputs(rng, dt, 2, 4, 2, 300, 400, 64)
    R = attn_ref(qh, kh, vh, dt, True, dout=doh)
    s = cp.cuda.Stream(non_blocking=True)
    res = {}
    with c.sub("inputs made on a busy non-blocking stream, attention and backward on it"):
        with s:
            junk = cp.full(1 << 26, 255, dtype=cp.uint8)  # NaN bytes for what reuses this memory on s
            del junk
            a = cp.ones((4096, 4096), dtype=cp.float32)
            for _ in range(6):
                a = cp.matmul(a, a) * np.float32(1.0 / 4096)  # ~1 ms each: the inputs below wait for them
            zero = a[0, 0] * 0
            devs = []
            for h in (qh, kh, vh, doh):
                x32 = cp.asarray(h.astype(np.float32)) + zero
                devs.append(x32.astype(dt))
            q, k, v, do = devs
            out, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
            grads = cuflash.attention_backward(do, q, k, v, out, lse, causal=True)
        s.synchronize()
        res.update(out=out, lse=lse, grads=grads)
        close("out", out, R.out, R.tol_out)
        close("lse", lse, R.lse, R.tol_lse)
        bwd_check("grads", R, grads, q, k, v, dt)
    with c.sub("two non-blocking streams, interleaved fwd + bwd of different shapes"):
        ss = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        calls = []
        for i in range(6):
            D = (64, 128)[i % 2]
            Sq = 700 + 97 * i
            (h4, _dd) = inputs(rng, dt, 1, 4, 2, Sq, Sq + 33, D)
            with ss[i % 2]:
                q, k, v, do = (to_dev(h, dt) for h in h4)
                out, lse = cuflash.attention(q, k, v, causal=bool(i % 3), return_lse=True)
                grads = cuflash.attention_backward(do, q, k, v, out, lse, causal=bool(i % 3))
            calls.append((h4, bool(i % 3), out, lse, grads, q, k, v))
        for st_ in ss:
            st_.synchronize()
        for h4, causal, out, lse, grads, q, k, v in calls:
            R = attn_ref(*h4[:3], dt, causal, dout=h4[3])
            close(f"out {q.shape}", out, R.out, R.tol_out)
            close(f"lse {q.shape}", lse, R.lse, R.tol_lse)
            bwd_check(f"grads {q.shape}", R, grads, q, k, v, dt)


@check("stale_results_same_shape")
def _(c):
    rng = rng_for(c.name)
    for dt, D in ((BF16, 64), (BF16, 128), (F32, 64)):
        shape = (2, 4, 2, 257, 300, D)
        (h1, d1) = inputs(rng, dt, *shape)
        with c.sub(f"{dt} d{D} first inputs"):
            R1 = attn_ref(*h1[:3], dt, True, dout=h1[3])
            fwd_bwd_check("first", R1, *d1, dt, True)
        with c.sub(f"{dt} d{D} the same arrays overwritten in place"):
            h2, d2 = inputs(rng, dt, *shape)
            for a, b in zip(d1, d2):
                bits16(a)[...] = bits16(b)
            R2 = attn_ref(*h2[:3], dt, True, dout=h2[3])
            fwd_bwd_check("overwritten", R2, *d1, dt, True)
        with c.sub(f"{dt} d{D} freed and reallocated"):
            del d1, d2
            cp.get_default_memory_pool().free_all_blocks()
            h3, d3 = inputs(rng, dt, *shape)
            R3 = attn_ref(*h3[:3], dt, True, dout=h3[3])
            fwd_bwd_check("reallocated", R3, *d3, dt, True)
        with c.sub(f"{dt} d{D} another shape, then this shape again"):
            h4, d4 = inputs(rng, dt, 1, 2, 1, 100, 50, D)
            fwd_bwd_check("other shape", attn_ref(*h4[:3], dt, True, dout=h4[3]), *d4, dt, True)
            h5, d5 = inputs(rng, dt, *shape)
            fwd_bwd_check("again", attn_ref(*h5[:3], dt, True, dout=h5[3]), *d5, dt, True)


@check("deterministic_bitwise_and_equivalent_arguments")
def _(c):
    rng = rng_for(c.name)
    for dt, D, window in ((BF16, 64, (50, 0)), (BF16, 100, (-1, -1)), (F16, 256, (-1, 30)), (F32, 64, (-1, -1))):
        (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, 2, 8, 2, 333, 517, D)
        causal = window == (-1, -1)
        R = attn_ref(qh, kh, vh, dt, causal, window, dout=doh)
        out, lse = cuflash.attention(q, k, v, causal=causal, window_size=window, return_lse=True)
        with c.sub(f"{dt} d{D} window={window} backward deterministic=True, 3 calls bitwise"):
            g0 = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, window_size=window,
                                            deterministic=True)
            bwd_check("det", R, g0, q, k, v, dt)
            for _ in range(2):
                g = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, window_size=window,
                                               deterministic=True)
                for n, a, b in zip(("dq", "dk", "dv"), g, g0):
                    same_bits(n, a, b)
        with c.sub(f"{dt} d{D} window={window} default backward: dk, dv bitwise over 3 calls (documented)"):
            g1 = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, window_size=window)
            bwd_check("atomic", R, g1, q, k, v, dt)
            for _ in range(2):
                g = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, window_size=window)
                same_bits("dk", g[1], g1[1])
                same_bits("dv", g[2], g1[2])
                if dt == F32:
                    same_bits("dq (float32: always deterministic)", g[0], g1[0])
    (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, BF16, 1, 4, 2, 300, 300, 64)
    for sch in SCHEDULES:
        with c.sub(f"forward {sch}: 3 calls bitwise (documented: the forward is deterministic)"):
            o0, l0 = cuflash.attention(q, k, v, causal=True, return_lse=True, schedule=sch)
            for _ in range(2):
                o, l = cuflash.attention(q, k, v, causal=True, return_lse=True, schedule=sch)
                same_bits("out", o, o0)
                same_bits("lse", l, l0)
        with c.sub(f"forward {sch}: causal == window (-1, 0) == causal + window (-1, 5) bitwise"):
            a = cuflash.attention(q, k, v, causal=True, return_lse=True, schedule=sch)
            b = cuflash.attention(q, k, v, window_size=(-1, 0), return_lse=True, schedule=sch)
            d = cuflash.attention(q, k, v, causal=True, window_size=(-1, 5), return_lse=True, schedule=sch)
            for x, y in ((a, b), (a, d)):
                same_bits("out", x[0], y[0])
                same_bits("lse", x[1], y[1])
    with c.sub("backward: causal == window (-1, 0), deterministic"):
        out, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
        a = cuflash.attention_backward(do, q, k, v, out, lse, causal=True, deterministic=True)
        b = cuflash.attention_backward(do, q, k, v, out, lse, window_size=(-1, 0), deterministic=True)
        for n, x, y in zip(("dq", "dk", "dv"), a, b):
            same_bits(n, x, y)
    with c.sub("schedule='auto' is the wgmma kernel on compute capability 9.0 (bitwise)"):
        if not is_sm90():
            raise Skip("not compute capability 9.0")
        for D in (64, 128):
            (qh, kh, vh, _), (q, k, v, _d) = inputs(rng, BF16, 1, 4, 2, 400, 700, D)
            a = cuflash.attention(q, k, v, causal=True, return_lse=True)
            b = cuflash.attention(q, k, v, causal=True, return_lse=True, schedule="wgmma")
            same_bits(f"out d{D}", a[0], b[0])
            same_bits(f"lse d{D}", a[1], b[1])


@check("schedules_and_block_sizes_vs_float64")
def _(c):
    rng = rng_for(c.name)
    cfgs = [  # dt, B, Hq, Hkv, Sq, Sk, D, causal, window
        (BF16, 2, 6, 2, 300, 517, 64, False, (77, 13)),
        (BF16, 1, 4, 4, 517, 300, 40, True, (-1, -1)),
        (F16, 1, 2, 1, 129, 1, 128, True, (-1, -1)),
        (F16, 1, 2, 2, 1, 129, 96, False, (-1, 0)),
        (F32, 1, 3, 1, 200, 333, 96, False, (-1, 50)),
    ]
    for (dt, B, Hq, Hkv, Sq, Sk, D, causal, window) in cfgs:
        (qh, kh, vh, _), (q, k, v, _d) = inputs(rng, dt, B, Hq, Hkv, Sq, Sk, D)
        R = attn_ref(qh, kh, vh, dt, causal, window)
        scheds = list(SCHEDULES) + (["wgmma"] if is_sm90() and dt != F32 and D <= 128 else [])
        for sch in scheds:
            with c.sub(f"{dt} {Hq}/{Hkv} {Sq}x{Sk} d{D} causal={causal} window={window} {sch}"):
                fwd_check(sch, R, q, k, v, dt, causal, window, schedule=sch)
    (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, BF16, 1, 2, 1, 333, 301, 64)
    R = {cz: attn_ref(qh, kh, vh, BF16, cz, dout=doh) for cz in (False, True)}
    lists = {}
    with c.sub("available tiles named by the errors"):
        for sch, key in (("fa2", "available (Br, Bc, warps):"), ("fa1", "available:")) + \
                ((("wgmma", "available (Br, Bc, pv_n):"),) if is_sm90() else ()):
            e = expect_error(f"{sch} (96, 64)", ValueError, ["block_sizes|Br=96"], cuflash.attention, q, k, v,
                             schedule=sch, block_sizes=(96, 64))
            lists[sch] = err_list(str(e), key)
        e = expect_error("backward (96, 64)", ValueError, ["block_sizes"], cuflash.attention_backward, do, q, k, v,
                         q, cp.zeros(q.shape[:3], cp.float32), block_sizes=(96, 64))
        lists["bwd"] = err_list(str(e), "available:")
    for sch, tiles in lists.items():
        if sch == "fa1":
            tiles = [t for t in tiles if tuple(t) in ((16, 16), (64, 256), (128, 64))]
        for t in tiles:
            bs = tuple(t[:2]) if sch in ("fa1", "wgmma", "bwd") else tuple(t)
            for cz in (False, True):
                with c.sub(f"{sch} block_sizes={bs} causal={cz}"):
                    if sch == "bwd":
                        out, lse = cuflash.attention(q, k, v, causal=cz, return_lse=True)
                        for det in (False, True):
                            g = cuflash.attention_backward(do, q, k, v, out, lse, causal=cz, block_sizes=bs,
                                                           deterministic=det)
                            bwd_check(f"bwd {bs} det={det}", R[cz], g, q, k, v, BF16)
                    else:
                        fwd_check(f"{sch} {bs}", R[cz], q, k, v, BF16, cz, schedule=sch, block_sizes=bs)
    with c.sub("float32 ignores a valid block_sizes (documented)"):
        (qh, kh, vh, _), (q, k, v, _d) = inputs(rng, F32, 1, 2, 2, 100, 120, 64)
        same_bits("out", cuflash.attention(q, k, v, block_sizes=(128, 64)), cuflash.attention(q, k, v))


@check("empty_and_tiny_shapes_every_schedule")
def _(c):
    rng = rng_for(c.name)
    shapes = [  # (B, Hq, Hkv, Sq, Sk, D)
        (0, 2, 1, 5, 7, 64), (2, 0, 1, 5, 7, 64), (2, 2, 1, 0, 7, 64), (2, 2, 1, 5, 0, 64), (2, 2, 1, 0, 0, 40),
        (1, 1, 1, 1, 1, 64), (1, 1, 1, 1, 1, 1), (3, 2, 2, 1, 300, 8), (1, 2, 1, 300, 1, 128), (1, 1, 1, 2, 3, 200),
    ]
    for shp in shapes:
        B, Hq, Hkv, Sq, Sk, D = shp
        for dt in (BF16, F32):
            (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, B, Hq, Hkv, Sq, Sk, D)
            for causal in (False, True):
                R = attn_ref(qh, kh, vh, dt, causal, dout=doh)
                for sch in SCHEDULES:
                    with c.sub(f"{shp} {dt} causal={causal} {sch}"):
                        out, lse = fwd_check(sch, R, q, k, v, dt, causal, schedule=sch)
                        if Sk == 0 and out.size and not (np.all(host64(out) == 0) and np.all(np.isneginf(host64(lse)))):
                            raise Fail("no keys: out not all 0 or lse not all -inf")
                        if sch == "auto":
                            g = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal)
                            bwd_check("bwd", R, g, q, k, v, dt)


@check("value_edges_logits_scales_equal_inputs")
def _(c):
    rng = rng_for(c.name)
    cfgs = [  # label, dt, D, mag, scale, causal, schedule
        ("huge logits q,k ~ N(0, 40^2)", BF16, 128, 40.0, None, True, "auto"),
        ("huge logits fa2", BF16, 64, 40.0, None, False, "fa2"),
        ("huge logits float16 ~ N(0, 20^2)", F16, 64, 20.0, None, True, "auto"),
        ("sharp scale 1e4", BF16, 64, 1.0, 1e4, False, "auto"),
        ("sharp scale 1e4 float32", F32, 64, 1.0, 1e4, False, "auto"),
        ("tiny scale 1e-6", BF16, 128, 1.0, 1e-6, True, "auto"),
        ("negative scale -2", BF16, 64, 1.0, -2.0, True, "auto"),
        ("negative scale -2 fa2", F16, 64, 1.0, -2.0, True, "fa2"),
        ("zero scale", BF16, 64, 1.0, 0.0, False, "auto"),
        ("zero scale fa2 d256", BF16, 256, 1.0, 0.0, True, "auto"),
        ("zero scale float32", F32, 64, 1.0, 0.0, True, "auto"),
    ]
    for label, dt, D, mag, scale, causal, sch in cfgs:
        with c.sub(f"{label} ({dt}, d{D}, causal={causal}, {sch})"):
            (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, 1, 4, 2, 150, 230, D, mag)
            R = attn_ref(qh, kh, vh, dt, causal, (-1, -1), scale, dout=doh)
            out, lse = fwd_check(label, R, q, k, v, dt, causal, (-1, -1), scale, schedule=sch)
            g = cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, softmax_scale=scale)
            bwd_check(label, R, g, q, k, v, dt)
    for dt in (BF16, F16, F32):
        with c.sub(f"all-equal q and k ({dt}): uniform weights, dq = 0"):
            qh = np.full((1, 2, 120, 64), 0.5)
            kh = np.full((1, 2, 200, 64), -0.25)
            (vh, v), (doh, do) = rand(rng, (1, 2, 200, 64), dt), rand(rng, (1, 2, 120, 64), dt)
            q, k = to_dev(qh, dt), to_dev(kh, dt)
            R = attn_ref(qh, kh, vh, dt, True, dout=doh)
            fwd_bwd_check("equal", R, q, k, v, do, dt, True)
        with c.sub(f"large v values ({dt}, |v| ~ 3e4)"):
            (qh, kh, vh, doh), (q, k, v, do) = inputs(rng, dt, 1, 2, 2, 64, 90, 64)
            vh = rounded(vh * 1e4, dt)
            v = to_dev(vh, dt)
            R = attn_ref(qh, kh, vh, dt, False, dout=doh)
            fwd_bwd_check("large v", R, q, k, v, do, dt, False)


@check("large_batch_and_heads_grid_limits")
def _(c):
    for label, dt, B, Hq, Hkv, Sq, Sk, D, schs, bwd in (
            ("batch 65535", BF16, 65535, 2, 1, 3, 5, 32, ("auto", "fa2"), True),
            ("heads_q 65535 (MQA)", BF16, 1, 65535, 1, 2, 3, 64, ("auto", "fa2"), True),
            ("batch 65535 float32", F32, 65535, 1, 1, 2, 9, 32, ("auto",), True),
            ("fa1 / standard with batch*heads 70000 (documented: no 65535 limit)", BF16, 70000, 1, 1, 3, 5, 32,
             ("fa1", "standard"), False)):
        if SMALL:
            B, Hq = min(B, 300), min(Hq, 300)
        q, k, v, do = dev_inputs(dt, B, Hq, Hkv, Sq, Sk, D)
        R = attn_ref(q, k, v, dt, True, dout=do if bwd else None)
        for sch in schs:
            with c.sub(f"{label} {sch}"):
                out, lse = fwd_check(label, R, q, k, v, dt, True, schedule=sch)
                if bwd and sch == schs[0]:
                    for det in (False, True):
                        g = cuflash.attention_backward(do, q, k, v, out, lse, causal=True, deterministic=det)
                        bwd_check(f"{label} det={det}", R, g, q, k, v, dt)


@check("persistent_kernel_default_longest_first_groups")
def _(c):
    """The wgmma kernel's persistent grid orders masked work longest first within groups of heads sized by L2
    (default settings, a last group smaller than the others); checked on sampled (batch, head) pairs."""
    for dt, B, Hq, Hkv, S, D, causal, window in ((BF16, 4, 32, 8, 2125, 64, True, (-1, -1)),
                                                 (F16, 2, 16, 16, 4100, 128, False, (256, 0))):
        if SMALL:
            B, Hq, Hkv, S = 1, 4, 2, 300
        g = Hq // Hkv
        with c.sub(f"{dt} {B}x{Hq}/{Hkv} {S} d{D} causal={causal} window={window}"):
            q, k, v = dev_inputs(dt, B, Hq, Hkv, S, S, D, with_dout=False)
            out, lse = cuflash.attention(q, k, v, causal=causal, window_size=window, return_lse=True)
            for b, h in ((0, 0), (B - 1, Hq - 1), (B - 1, max(0, Hq - 5)), (B // 2, Hq // 2 + 1 if Hq > 2 else 0)):
                hk = h // g
                R = attn_ref(q[b:b + 1, h:h + 1], k[b:b + 1, hk:hk + 1], v[b:b + 1, hk:hk + 1], dt, causal, window)
                close(f"out ({b}, {h})", out[b:b + 1, h:h + 1], R.out, R.tol_out)
                close(f"lse ({b}, {h})", lse[b:b + 1, h:h + 1], R.lse, R.tol_lse)


def _huge_strides(c, dt, rng):
    it = dt.itemsize
    S = 1 << 30  # stride in elements
    n = 3 * S + (1 << 16)
    raw = cp.empty(n * it // 2, dtype=cp.uint16)  # 6 GiB (bfloat16) or 12 GiB (float32)
    buf = raw.view(cp.uint16 if it == 2 else cp.float32)
    as_ = cp.lib.stride_tricks.as_strided
    specs = {"seq": ((1, 2, 4, 64), (0, 64 * it, S * it, it), lambda t, b, h, s: s * S + h * 64 + t * 1024),
             "batch": ((3, 1, 2, 64), (S * it, 0, 64 * it, it), lambda t, b, h, s: b * S + s * 64 + t * 1024 + 512)}
    for kind, (shape, strides, off) in specs.items():
        st = {}
        with c.sub(f"{dt} {kind} stride 2^30 elements: write the rows"):
            hs, views = [], []
            for t in range(4):  # q, k, v, dout
                shp = shape if t in (0, 3) else (shape[0], 1) + shape[2:]
                h = rounded(rng.standard_normal(shp), dt)
                hs.append(h)
                for b in range(shp[0]):
                    for hh in range(shp[1]):
                        for s_ in range(shp[2]):
                            row = np.ascontiguousarray(h[b, hh, s_].astype(dt))
                            setrow(buf, off(t, b, hh, s_), row.view(np.uint16) if it == 2 else row)
                base = buf[off(t, 0, 0, 0):]
                views.append(as_(base, shp, strides).view(dt) if it == 2 else as_(base, shp, strides))
            st["views"], st["R"] = views, attn_ref(*hs[:3], dt, True, dout=hs[3])
        if not st:
            continue
        q, k, v, do = st["views"]
        R = st["R"]
        for sch in SCHEDULES:
            with c.sub(f"{dt} {kind} stride 2^30 elements, {sch}"
                       + (" (its float32 copies are CuPy elementwise kernels on the views)" if sch == "standard" else "")):
                fwd_check(f"{kind} stride {sch}", R, q, k, v, dt, True, schedule=sch)
        for det in (False, True):
            with c.sub(f"{dt} {kind} stride 2^30 elements, backward deterministic={det}"):
                out, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
                bwd_check(f"{kind} stride bwd det={det}", R,
                          cuflash.attention_backward(do, q, k, v, out, lse, causal=True, deterministic=det),
                          q, k, v, dt)


@check("huge_strides_int64_offsets")
def _(c):
    """Views whose element offsets pass 2^31 (seq or batch stride of 2^30 elements over a 6 / 12 GiB buffer): any
    int32 index arithmetic shows as wrong values or a fault. Rows written by contiguous slices only."""
    if SMALL:
        raise Skip("PROBE_SMALL: needs a 6-12 GiB buffer")
    rng = rng_for(c.name)
    for dt in (BF16, F32):
        _huge_strides(c, dt, rng)
        cp.get_default_memory_pool().free_all_blocks()


# ------------------------------------------------------------------------------------------------------------
# run order: most likely to find something first (a cold kernel cache may run out of PROBE_BUDGET_S; the rest SKIP)
ORDER = ["fwd_fully_masked_rows_exact_zero_with_nonfinite_k",
         "fwd_nonfinite_inputs_propagate_alike_on_every_schedule",
         "bwd_fully_masked_rows_zero_grad_with_nonfinite_k",
         "masked_keys_with_nonfinite_k_isolated",
         "bad_inputs_raise_clear_errors",
         "bwd_lse_dtypes_and_dout_out_layouts",
         "bwd_windows_scales_gqa_vs_float64",
         "readme_api_tour_attention",
         "torch_readme_autograd_function",
         "torch_sdpa_semantics_and_gradients",
         "layouts_views_strides_fwd_bwd",
         "head_dims_around_native_fwd_bwd",
         "value_edges_logits_scales_equal_inputs",
         "nondefault_streams_fwd_bwd",
         "stale_results_same_shape",
         "deterministic_bitwise_and_equivalent_arguments",
         "schedules_and_block_sizes_vs_float64",
         "empty_and_tiny_shapes_every_schedule",
         "large_batch_and_heads_grid_limits",
         "persistent_kernel_default_longest_first_groups",
         "huge_strides_int64_offsets"]


def main():
    if "--list" in sys.argv:
        for name, _f_, tn in sorted(CHECKS, key=lambda t: ORDER.index(t[0]) if t[0] in ORDER else 999):
            print(name + ("  (torch)" if tn else ""))
        return 0
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    try:
        gpu = gpu_name(cp, with_cc=True)
    except Exception as e:
        gpu = f"? ({_exc_text(e)})"
    print(f"# newuser_attn_probe: GPU {gpu}; cupy {cp.__version__}, numpy {np.__version__}, "
          f"torch {torch.__version__ if torch is not None else TORCH_WHY}; budget {BUDGET:.0f} s, hard {HARD:.0f} s",
          flush=True)
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
        CUR["check"] = c
        state["name"], state["t"] = name, time.time()
        try:
            f(c)
        except Skip as e:
            if not c.fails:
                print(f"SKIP {name}: {e}", flush=True)
                counts["SKIP"] += 1
                continue
            c.note(f"rest skipped: {e}")
        except OutOfTime as e:
            c.note(f"steps from [{e}] on not run: past {STEP_DEADLINE:.0f} s")
        except Fail as e:
            c.fails.append(str(e))
        except Exception as e:
            c.fails.append(f"unexpected {_exc_text(e)}")
        try:
            sync()  # an asynchronous kernel fault surfaces here
        except Exception as e:
            c.fails.append(f"device error after the check: {_exc_text(e)}")
        dt = time.time() - state["t"]
        extra = (f"; worst err/tol {c.worst:.2f}" if c.worst else "") + ("; " + "; ".join(c.notes) if c.notes else "")
        if c.fails:
            counts["FAIL"] += 1
            print(f"FAIL {name}: " + " | ".join(c.fails) + f"  [{len(c.fails)} of {c.steps} steps failed, {dt:.1f} s"
                  f"{extra}]", flush=True)
        else:
            counts["PASS"] += 1
            print(f"PASS {name}  [{c.steps} steps, {dt:.1f} s{extra}]", flush=True)
        CUR["check"] = None
        try:
            cp.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass
    total = sum(counts.values())
    print(f"SUMMARY: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped of {total} checks "
          f"in {time.time() - T0:.1f} s", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
