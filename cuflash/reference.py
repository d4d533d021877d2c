"""float64 NumPy references: the ground truth every kernel is checked against, and the CPU path of the math.

Softmax and logsumexp defer to ``scipy.special`` (their semantics are the API's); the online-softmax state
``(m, l)`` and its merge follow Milakov & Gimelshein, *Online normalizer calculation for softmax* (2018);
attention follows Dao et al., *FlashAttention* (2022), with the causal mask aligned to the bottom-right corner
as FlashAttention >= 2.1 does.
"""
from __future__ import annotations

import numpy as np
import scipy.special


def _f64(x):
    if hasattr(x, "get"):  # CuPy array -> host
        x = x.get()
    return np.asarray(x).astype(np.float64)


def softmax(x, axis=None):
    return scipy.special.softmax(_f64(x), axis=axis)


def log_softmax(x, axis=None):
    return scipy.special.log_softmax(_f64(x), axis=axis)


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False):
    return scipy.special.logsumexp(_f64(a), axis=axis, b=None if b is None else _f64(b), keepdims=keepdims,
                                   return_sign=return_sign)


def online_softmax_state(x, axis=-1):
    """The state (m, l) of a row: m = max(x), l = sum(exp(x - m)); an empty or all -inf row gives (-inf, 0)."""
    x = _f64(x)
    m = np.max(x, axis=axis) if x.shape[axis] else np.full(np.delete(x.shape, axis % x.ndim), -np.inf)
    with np.errstate(invalid="ignore"):
        safe_m = np.where(np.isneginf(m), 0.0, m)
        l = np.sum(np.exp(x - np.expand_dims(safe_m, axis)), axis=axis)
    return m, l


def merge_states(a, b):
    """Merge two states: m = max(ma, mb), l = la·e^(ma−m) + lb·e^(mb−m); empty states (−inf, 0) stay empty."""
    ma, la = (_f64(t) for t in a)
    mb, lb = (_f64(t) for t in b)
    m = np.maximum(ma, mb)
    safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(invalid="ignore"):
        l = la * np.exp(ma - safe) + lb * np.exp(mb - safe)
    l = np.where(np.isneginf(m), 0.0, l)
    return m, l


def attention_mask(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1)):
    """Boolean (seqlen_q, seqlen_k) mask of allowed keys, bottom-right aligned (query i sits at key i + sk - sq)."""
    i = np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = np.arange(seqlen_k)[None, :]
    left, right = window_size
    if causal:
        right = 0
    allowed = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if right >= 0:
        allowed &= j <= i + right
    if left >= 0:
        allowed &= j >= i - left
    return allowed


def attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1)):
    """Exact attention in float64. q: (B, Hq, Sq, D), k/v: (B, Hkv, Sk, D), Hq % Hkv == 0.

    Returns ``(out, lse)``: out (B, Hq, Sq, Dv) float64, lse (B, Hq, Sq) float64. A query row that sees no key
    gives out = 0 and lse = -inf.
    """
    q, k, v = _f64(q), _f64(k), _f64(v)
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    g = Hq // Hkv
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    scale = 1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    allowed = attention_mask(Sq, Sk, causal, window_size)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    msafe = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - msafe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.einsum("bhij,bhjd->bhid", p, v) / np.where(l == 0, 1.0, l)
        lse = (msafe + np.log(l))[..., 0]
    out = np.where(l == 0, 0.0, out)
    return out, lse


def attention_backward(dout, q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1)):
    """float64 gradients (dq, dk, dv) of ``attention`` (dk, dv summed over each GQA group)."""
    dout, q, k, v = _f64(dout), _f64(q), _f64(k), _f64(v)
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    g = Hq // Hkv
    kr = np.repeat(k, g, axis=1)
    vr = np.repeat(v, g, axis=1)
    scale = 1.0 / np.sqrt(D) if softmax_scale is None else softmax_scale
    s = np.einsum("bhid,bhjd->bhij", q, kr) * scale
    allowed = attention_mask(Sq, Sk, causal, window_size)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    msafe = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - msafe)
    l = p.sum(axis=-1, keepdims=True)
    p = p / np.where(l == 0, 1.0, l)
    dv = np.einsum("bhij,bhid->bhjd", p, dout)
    dp = np.einsum("bhid,bhjd->bhij", dout, vr)
    dsum = (p * dp).sum(-1, keepdims=True)
    ds = p * (dp - dsum)
    dq = np.einsum("bhij,bhjd->bhid", ds, kr) * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, q) * scale
    dk = dk.reshape(B, Hkv, g, Sk, D).sum(2)
    dv = dv.reshape(B, Hkv, g, Sk, v.shape[-1]).sum(2)
    return dq, dk, dv


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, residual=None):
    """float64 LayerNorm over the trailing ``normalized_shape`` dims; returns (y, mean, rstd[, h])."""
    x = _f64(x)
    if residual is not None:
        x = x + _f64(residual)
    nd = len(tuple(normalized_shape))
    axes = tuple(range(x.ndim - nd, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return y, mean.reshape(x.shape[: x.ndim - nd]), rstd.reshape(x.shape[: x.ndim - nd]), x


def rms_norm(x, normalized_shape, weight=None, eps=1e-6, residual=None):
    """float64 RMSNorm: y = x / sqrt(mean(x²) + eps) · weight; returns (y, rstd, h)."""
    x = _f64(x)
    if residual is not None:
        x = x + _f64(residual)
    nd = len(tuple(normalized_shape))
    axes = tuple(range(x.ndim - nd, x.ndim))
    rstd = 1.0 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * _f64(weight)
    return y, rstd.reshape(x.shape[: x.ndim - nd]), x


def _norm_backward(dy, x, weight, mean, rstd):
    """Shared by the two backwards: float64 (dx, dweight, dbias) of y = xhat · w (+ b), xhat = (x − mean) · rstd
    over the last dim of 2-D ``x``, given the saved statistics (mean None: RMSNorm, xhat = x · rstd)."""
    dy, x = _f64(dy), _f64(x)
    r = _f64(rstd).reshape(-1, 1)
    mu = _f64(mean).reshape(-1, 1) if mean is not None else 0.0
    xhat = (x - mu) * r
    g = dy * (_f64(weight) if weight is not None else 1.0)
    c2 = (g * xhat).mean(-1, keepdims=True)
    c1 = g.mean(-1, keepdims=True) if mean is not None else 0.0
    return r * (g - c1 - xhat * c2), (dy * xhat).sum(0), dy.sum(0)


def layer_norm_backward(dy, x, weight, mean, rstd):
    """float64 gradients of LayerNorm over the last dim of 2-D ``x`` (rows, hidden) given the saved float32
    statistics ``mean``, ``rstd`` (rows,), as ``cuflash.layer_norm_backward`` takes them: returns
    (dx (rows, hidden), dweight (hidden,), dbias (hidden,)).
    dx = rstd · (g − mean(g) − xhat · mean(g · xhat)) with g = dy · w, xhat = (x − mean) · rstd
    (Ba et al. 2016, differentiated; ``tests/test_norm.py`` checks it against
    finite differences of :func:`layer_norm`)."""
    return _norm_backward(dy, x, weight, mean, rstd)


def rms_norm_backward(dy, x, weight, rstd):
    """float64 gradients of RMSNorm over the last dim of 2-D ``x`` given the saved ``rstd`` (rows,), as
    ``cuflash.rms_norm_backward`` takes it: returns (dx, dweight).
    dx = rstd · (g − xhat · mean(g · xhat)), g = dy · w, xhat = x · rstd
    (Zhang & Sennrich 2019, differentiated; checked against finite differences in the tests)."""
    return _norm_backward(dy, x, weight, None, rstd)[:2]
