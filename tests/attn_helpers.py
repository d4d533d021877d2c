"""Helpers shared by tests/test_attention.py and tests/test_attention_sm90.py: the attention mask, the float64
reference ``ref64``, the same-precision baseline of the FlashAttention rule (S and P rounded to the input dtype,
fp32 accumulation), ``randn``, and ``device_free_array`` (a CuPy array header over untouched memory, for the
argument checks that must raise before any launch; test_softmax.py and test_validation.py use it too). CuPy is
imported inside the functions (``cp`` passed in or imported), so collecting the tests needs no GPU.
"""
import math

import numpy as np


def _mask(cp, sq, sk, causal, window):
    left, right = window
    if causal:
        right = 0
    i = cp.arange(sq)[:, None] + (sk - sq)
    j = cp.arange(sk)[None, :]
    ok = cp.ones((sq, sk), dtype=bool)
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    return ok


def ref64(q, k, v, causal=False, scale=None, window=(-1, -1)):
    """float64 attention on the GPU: (out, lse); out 0 and lse -inf for rows that see no key."""
    import cupy as cp

    q, k, v = (a.astype(cp.float64) for a in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = cp.repeat(k, g, axis=1), cp.repeat(v, g, axis=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = cp.matmul(q, k.swapaxes(-1, -2)) * scale
    s = cp.where(_mask(cp, q.shape[2], k.shape[2], causal, window), s, -cp.inf)
    m = s.max(-1, keepdims=True)
    ms = cp.where(cp.isneginf(m), 0.0, m)
    p = cp.exp(s - ms)
    l = p.sum(-1, keepdims=True)
    out = cp.matmul(p, v) / cp.where(l == 0, 1.0, l)
    lse = cp.where(l[..., 0] == 0, -cp.inf, ms[..., 0] + cp.log(cp.where(l == 0, 1.0, l))[..., 0])
    return cp.where(l == 0, 0.0, out), lse


def _round(x, dt):
    return x.astype(dt).astype(np.float32)


def baseline(q, k, v, causal=False, scale=None, window=(-1, -1)):
    """Straightforward same-precision attention: S and P rounded to the input dtype, fp32 accumulation."""
    import cupy as cp

    dt = q.dtype
    qf, kf, vf = (a.astype(cp.float32) for a in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kf, vf = cp.repeat(kf, g, axis=1), cp.repeat(vf, g, axis=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _round(cp.matmul(qf, kf.swapaxes(-1, -2)), dt) * np.float32(scale)
    s = cp.where(_mask(cp, q.shape[2], k.shape[2], causal, window), s, -cp.inf)
    m = s.max(-1, keepdims=True)
    ms = cp.where(cp.isneginf(m), 0.0, m)
    p = cp.exp(s - ms)
    l = p.sum(-1, keepdims=True)
    p = _round(p / cp.where(l == 0, 1.0, l), dt)
    return _round(cp.matmul(p, vf), dt)


def randn(cp, rng, shape, dt, scale=1.0):
    return cp.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dt)


def device_free_array(shape, dtype=np.float32, strides=None):
    """A CuPy array header over memory that is never touched (no GPU needed): argument checks that run before
    any launch or device query raise on it; anything that reaches the device fails differently."""
    import pytest

    cupy = pytest.importorskip("cupy")
    dt = np.dtype(dtype)
    mem = cupy.cuda.UnownedMemory(0x10000000, max(int(np.prod(shape)) * dt.itemsize, 1), None, device_id=0)
    return cupy.ndarray(shape, dt, memptr=cupy.cuda.MemoryPointer(mem, 0), strides=strides)
