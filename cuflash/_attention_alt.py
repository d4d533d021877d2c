"""The two schedules FlashAttention is measured against: standard attention and FlashAttention-1.

``attention(..., schedule="standard")`` and ``schedule="fa1"`` (cuflash/attention.py) call these on a prepared
:class:`~cuflash._attn_common.AttnProblem`. Both exist to make the IO argument of the FlashAttention paper
(Dao et al. 2022) measurable on the same inputs as the FA-2 kernel; neither is meant to be fast.

- :func:`standard_forward` is Algorithm 0 of the paper: S = scale * Q K^T and P = softmax(S) are written to HBM
  (float32 — q, k, v are cast to float32 and the products use ``cupy.matmul`` on float32 arrays, i.e. cuBLAS
  SGEMM with float32 accumulation; no TF32 unless CuPy is told to), then O = P V. Theta(N d + N^2) HBM traffic
  (Theorem 2); ``traffic.attention_bytes("standard", ...)`` counts it.
- :func:`fa1_forward` is Algorithm 1 of the paper: K/V tiles are the outer loop (one kernel launch per outer
  step, ``cuda_src/attention_fa1.cu``), Q tiles the inner one, and O (float32, kept normalised), m and l are
  read from and written back to HBM on every outer step: Theta(N^2 d^2 / M) traffic;
  ``traffic.attention_bytes("fa1", ...)``.

Masks are bottom-right aligned (FlashAttention >= 2.1); a query row that sees no key gives out 0, lse -inf.
"""
from __future__ import annotations

import math

import numpy as np

from . import _compile, _dtypes
from ._attn_common import parse_block_sizes

SOURCE = "attention_fa1.cu"
NT = 256
# (Br, Bc) instantiated for fa1 (every dtype); the first that fits the device's shared memory is the default.
FA1_TILES = [(16, 16), (32, 32), (64, 16), (64, 32), (64, 64), (64, 128), (64, 256), (128, 64)]
FA1_DEFAULTS = [(64, 64), (32, 32), (16, 16)]
_CTYPES = {_dtypes.float16: "__half", _dtypes.bfloat16: "__nv_bfloat16", _dtypes.float32: "float"}


def fa1_kernel_name(dtype, Br: int, Bc: int) -> str:
    return f"fa1::fa1_step<{_CTYPES[np.dtype(dtype)]}, {int(Br)}, {int(Bc)}>"


def fa1_smem_bytes(head_dim: int, Br: int, Bc: int) -> int:
    """Dynamic shared memory of one fa1 block: Qi, Kj, Vj in float32 (rows padded to an odd stride), the
    Br x (Bc + 1) score tile and two per-row coefficients."""
    ld = head_dim | 1
    return 4 * ((Br + 2 * Bc) * ld + Br * (Bc + 1) + 2 * Br)


def _declare():
    names = [fa1_kernel_name(dt, br, bc) for dt in _CTYPES for br, bc in FA1_TILES]
    _compile.declare(SOURCE, names, release=True)


_declare()


def _smem_limit() -> int:
    import cupy

    return _compile.max_shared_optin(cupy.cuda.runtime.getDevice())


def fa1_tiles(p, block_sizes=None) -> tuple[int, int]:
    """(Br, Bc) for ``p``: ``block_sizes`` checked against :data:`FA1_TILES` and the device's shared memory, else
    the largest default that fits. ValueError (ConfigurationError) names the configuration otherwise."""
    d = p.head_dim
    if block_sizes is not None:  # the format and the instantiated set first: no device query for a bad pair
        br, bc = parse_block_sizes(block_sizes)
        if (br, bc) not in FA1_TILES:
            raise ValueError(f"fa1 block_sizes (Br={br}, Bc={bc}) is not instantiated; available: {FA1_TILES}")
    limit = _smem_limit()
    if block_sizes is None:
        for br, bc in FA1_DEFAULTS:
            if fa1_smem_bytes(d, br, bc) <= limit:
                return br, bc
        raise _compile.ConfigurationError(f"fa1: no tile size fits head_dim {d} in {limit} bytes of shared memory")
    need = fa1_smem_bytes(d, br, bc)
    if need > limit:
        raise _compile.ConfigurationError(
            f"fa1 block_sizes (Br={br}, Bc={bc}), head_dim {d}: needs {need} bytes of shared memory, "
            f"the device allows {limit}")
    return br, bc


def to_float32(a):
    """A float32 copy of a CuPy array; bfloat16 is widened by its bits (exact, no reliance on CuPy's
    bfloat16 ufunc loops)."""
    import cupy

    if a.dtype == _dtypes.bfloat16:
        return (a.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)
    return a.astype(cupy.float32)


def from_float32(x, dtype):
    """``x`` (float32 CuPy array) rounded to ``dtype``; bfloat16 by round-to-nearest-even on the bits (NaN kept)."""
    import cupy

    dt = np.dtype(dtype)
    if dt == _dtypes.bfloat16:
        x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        u = x.view(cupy.uint32)
        r = ((u + cupy.uint32(0x7FFF) + ((u >> 16) & cupy.uint32(1))) >> 16).astype(cupy.uint16)
        r = cupy.where(cupy.isnan(x), cupy.uint16(0x7FC0), r).astype(cupy.uint16)
        return r.view(dt)
    return x.astype(dt)


def _unit_last_stride(a):
    import cupy

    return a if (a.shape[-1] == 1 or a.strides[-1] == a.itemsize) else cupy.ascontiguousarray(a)


def fa1_forward(p, block_sizes=None, return_lse: bool = True):
    """FlashAttention-1 forward (Dao et al. 2022, Algorithm 1) on a prepared problem; returns (out, lse).

    One launch per outer K/V tile step j = 0 .. ceil(Sk / Bc) - 1; grid (batch * heads_q, ceil(Sq / Br)) blocks
    of 256 threads. Each block re-reads its float32 O_i, m_i, l_i from HBM and writes them back (the paper's
    lines 8 and 13), so the traffic is ``traffic.attention_bytes("fa1", ...)``. The last step a Q tile visits
    writes ``out`` in the input dtype and ``lse`` (float32) instead. SIMT float32 arithmetic (a study kernel,
    not tensor cores). Supports float16, bfloat16, float32; any head_dim <= 256; causal/window masks; GQA.

    Returns out (B, Hq, Sq, D) in q's dtype (contiguous) and lse (B, Hq, Sq) float32 (always computed; the
    ``return_lse`` flag is accepted for symmetry).
    """
    import cupy

    B, Hq, Sq, Sk, D = p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, p.head_dim
    br, bc = fa1_tiles(p, block_sizes)
    out = cupy.empty((B, Hq, Sq, D), dtype=p.dtype)
    lse = cupy.empty((B, Hq, Sq), dtype=np.float32)
    if out.size == 0 and lse.size == 0:
        return out, lse
    if Sk == 0:
        lse.fill(-np.inf)
        return from_float32(cupy.zeros((B, Hq, Sq, D), dtype=np.float32), p.dtype), lse
    Tr, Tc = math.ceil(Sq / br), math.ceil(Sk / bc)
    if Tr > 65535:
        raise ValueError(f"fa1: seqlen_q {Sq} needs {Tr} Q tiles of {br} rows; at most 65535 are supported")
    if B * Hq > 2**31 - 1:
        raise ValueError(f"fa1: batch * heads_q = {B * Hq} is too large")
    q, k, v = (_unit_last_stride(a) for a in (p.q, p.k, p.v))
    o_acc = cupy.empty((B, Hq, Sq, D), dtype=np.float32) if Tc > 1 else cupy.empty((1,), np.float32)
    m_buf = cupy.empty((B, Hq, Sq), dtype=np.float32) if Tc > 1 else cupy.empty((1,), np.float32)
    l_buf = cupy.empty_like(m_buf)
    it = q.itemsize

    def st(a):
        s = a.strides
        return [np.int64(s[0] // it), np.int64(s[1] // it), np.int64(s[2] // it)]

    left, right = p.window
    kern = _compile.get_kernel(SOURCE, fa1_kernel_name(p.dtype, br, bc))
    smem = fa1_smem_bytes(D, br, bc)
    head = [q, k, v, o_acc, m_buf, l_buf, out, lse, np.int32(Hq), np.int32(p.group), np.int32(Sq), np.int32(Sk),
            np.int32(D), *st(q), *st(k), *st(v), np.float32(p.softmax_scale), np.int32(left), np.int32(right)]
    grid, block = (B * Hq, Tr), (NT,)
    what = f"fa1 (Br={br}, Bc={bc}), head_dim {D}, {p.dtype}"
    for j in range(Tc):
        _compile.launch(kern, grid, block, tuple(head + [np.int32(j)]), shared_mem=smem, what=what)
    return out, lse


# ----------------------------------------------------------------------------------------------------------
def _row_has_no_key(p) -> np.ndarray:
    """Boolean (Sq,): query rows that see no key under the mask (bottom-right aligned)."""
    i = np.arange(p.seqlen_q, dtype=np.int64)
    shift = p.seqlen_k - p.seqlen_q
    left, right = p.window
    hi = np.full_like(i, p.seqlen_k) if right < 0 else np.minimum(p.seqlen_k, i + shift + right + 1)
    lo = np.zeros_like(i) if left < 0 else np.maximum(0, i + shift - left)
    return hi <= lo


def _mask_bias(p):
    """(Sq, Sk) float32 on the device: 0 where the key is visible, -inf where masked."""
    import cupy

    shift = p.seqlen_k - p.seqlen_q
    left, right = p.window
    i = cupy.arange(p.seqlen_q, dtype=cupy.int64)[:, None]
    j = cupy.arange(p.seqlen_k, dtype=cupy.int64)[None, :]
    ok = cupy.ones((p.seqlen_q, p.seqlen_k), dtype=bool)
    if right >= 0:
        ok &= j <= i + shift + right
    if left >= 0:
        ok &= j >= i + shift - left
    with np.errstate(divide="ignore"):
        return cupy.log(ok.astype(cupy.float32))   # log 1 = 0, log 0 = -inf


def _softmax_last(s):
    """Row softmax over the last axis: cuflash.softmax when present, else CuPy (max-subtracted)."""
    try:
        from .softmax import softmax as _sm
    except ImportError:  # pragma: no cover - cuflash.softmax is part of the package
        _sm = None
    if _sm is not None:
        return _sm(s, axis=-1)
    import cupy

    m = s.max(axis=-1, keepdims=True)
    m = cupy.where(cupy.isfinite(m), m, cupy.float32(0))
    e = cupy.exp(s - m)
    return e / e.sum(axis=-1, keepdims=True)


def _logsumexp_last(s):
    try:
        from .softmax import logsumexp as _lse
    except ImportError:  # pragma: no cover
        _lse = None
    if _lse is not None:
        return _lse(s, axis=-1)
    import cupy

    m = s.max(axis=-1, keepdims=True)
    m = cupy.where(cupy.isfinite(m), m, cupy.float32(0))
    return (cupy.log(cupy.exp(s - m).sum(axis=-1, keepdims=True)) + m)[..., 0]


def standard_forward(p, return_lse: bool = True):
    """Standard attention (Dao et al. 2022, Algorithm 0) with S and P materialised in HBM; returns (out, lse).

    Steps (all float32 in HBM): cast q (times softmax_scale), k, v to float32; S = Q K^T by ``cupy.matmul``
    (cuBLAS SGEMM, float32 accumulate) with the GQA groups folded into the row axis (q viewed as
    (B, Hkv, group * Sq, D), so K/V are never repeated); masks added in place as a 0 / -inf bias (one more
    read + write of S); P = softmax(S) (``cuflash.softmax``); ``lse = logsumexp(S)`` only when ``return_lse``
    (one more read of S); O = P V; cast to q's dtype. Fully masked rows: out 0, lse -inf.

    Memory: 2 * B * Hq * Sq * Sk * 4 bytes for S and P. Returns out (B, Hq, Sq, D) in q's dtype and lse
    (B, Hq, Sq) float32 (None when ``return_lse`` is False).
    """
    import cupy

    B, Hq, Hkv, Sq, Sk, D = p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim
    g = p.group
    f32 = cupy.float32
    lse = cupy.empty((B, Hq, Sq), dtype=np.float32) if return_lse else None
    if B * Hq * Sq * D == 0 or Sk == 0:
        if lse is not None:
            lse.fill(-np.inf)
        return from_float32(cupy.zeros((B, Hq, Sq, D), dtype=f32), p.dtype), lse
    qf = cupy.empty((B, Hq, Sq, D), dtype=f32)
    qf[...] = to_float32(p.q)
    qf *= f32(p.softmax_scale)
    kf = cupy.empty((B, Hkv, Sk, D), dtype=f32)
    kf[...] = to_float32(p.k)
    vf = cupy.empty((B, Hkv, Sk, D), dtype=f32)
    vf[...] = to_float32(p.v)
    s = cupy.matmul(qf.reshape(B, Hkv, g * Sq, D), kf.transpose(0, 1, 3, 2))  # (B, Hkv, g*Sq, Sk), HBM
    del qf, kf
    if p.window != (-1, -1):  # masked scores set to -inf (an added -inf bias made inf scores NaN: inf + -inf)
        cupy.copyto(s.reshape(B, Hkv, g, Sq, Sk), f32(-np.inf), where=cupy.isneginf(_mask_bias(p)))
    if return_lse:
        lse[...] = _logsumexp_last(s).reshape(B, Hq, Sq)
    pm = _softmax_last(s)                                                       # P, HBM
    del s
    o = cupy.matmul(pm, vf)                                                     # (B, Hkv, g*Sq, D)
    del pm
    o = o.reshape(B, Hq, Sq, D)
    empty = _row_has_no_key(p)
    if empty.any():
        idx = cupy.asarray(np.nonzero(empty)[0])
        o[:, :, idx, :] = 0
        if lse is not None:
            lse[:, :, idx] = -np.inf
    return from_float32(o, p.dtype), lse
