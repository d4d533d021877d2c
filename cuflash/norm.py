"""LayerNorm and RMSNorm on CuPy arrays: float32 statistics, fused residual add, forward and backward.

Normalisation is memory-bound, so each kernel makes one pass over HBM per row: the row (``h = x`` or
``h = x + residual``) is loaded once, kept on chip (registers, then shared memory; re-read from L2 only for
rows beyond ~100K elements), reduced to its statistics and written once. The statistics are float32 whatever
the input dtype: LayerNorm uses Welford's running (count, mean, M2) merged across lanes, warps and blocks with
Chan, Golub & LeVeque's pairwise formula (never E[x^2] - E[x]^2), RMSNorm accumulates x^2 in float32 (float16
x^2 overflows above |x| ~ 256).

- LayerNorm: Ba, Kiros & Hinton, "Layer Normalization" (2016): ``y = (h - mean) / sqrt(var + eps) * w + b``
  with the biased variance, as ``torch.nn.functional.layer_norm``.
- RMSNorm: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019): ``y = h / sqrt(mean(h^2) + eps) * w``,
  as ``torch.nn.functional.rms_norm`` (``eps=None`` means ``finfo(x.dtype).eps``).

Kernels: ``cuda_src/norm.cu`` (``norm_fwd``, ``norm_bwd``, ``reduce_parts``) and ``cuda_src/cuflash/welford.cuh``.
"""
from __future__ import annotations

import math

import numpy as np

from . import _compile, _dtypes

__all__ = ["layer_norm", "rms_norm", "layer_norm_backward", "rms_norm_backward"]

_SRC = "norm.cu"
LAYER, RMS = 0, 1
NV = 4          # 16-byte vectors per thread kept in registers (norm_fwd / norm_bwd template argument)
MAX_THREADS = 512  # __launch_bounds__ of norm_fwd / norm_bwd
_TYPES = (_dtypes.float32, _dtypes.float16, _dtypes.bfloat16)
_NULL = np.uint64(0)  # a null pointer argument


def _wtypes(dt):
    """Weight/bias dtypes accepted with inputs of dtype ``dt``: float32 or ``dt`` itself."""
    return (_dtypes.float32,) if dt == _dtypes.float32 else (_dtypes.float32, dt)


def _fwd_name(dt, wdt, kind, res=False):
    return f"cuflash::norm_fwd<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, {NV}, {'true' if res else 'false'}>"


def _bwd_name(dt, wdt, kind):
    return f"cuflash::norm_bwd<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, {NV}>"


def _red_name(odt):
    return f"cuflash::reduce_parts<{_dtypes.ctype(odt)}>"


def _declare():
    names = []
    for dt in _TYPES:
        for wdt in _wtypes(dt):
            for kind in (LAYER, RMS):
                names += [_fwd_name(dt, wdt, kind, False), _fwd_name(dt, wdt, kind, True), _bwd_name(dt, wdt, kind)]
        names.append(_red_name(dt))
    _compile.declare(_SRC, names)


_declare()


# ------------------------------------------------------------------------------------------------------------
# validation helpers (no device work)
def _cupy():
    import cupy

    return cupy


def _as_device(a, what):
    cp = _cupy()
    if isinstance(a, cp.ndarray):
        return a
    if isinstance(a, np.ndarray) or not (hasattr(a, "__cuda_array_interface__") or hasattr(a, "__dlpack__")):
        raise TypeError(f"{what} must be a CuPy array (or a device array CuPy takes zero-copy), "
                        f"got {type(a).__name__}")
    return cp.asarray(a)


def _aligned(a, align=16):
    """C-contiguous with a base pointer aligned to ``align`` bytes (copies only when it is not)."""
    cp = _cupy()
    if not a.flags.c_contiguous:
        a = cp.ascontiguousarray(a)  # a fresh allocation: 256-byte aligned
    if a.data.ptr % align:
        a = a.copy()
    return a


def _normalized_shape(normalized_shape):
    if isinstance(normalized_shape, (int, np.integer)):
        return (int(normalized_shape),)
    try:
        return tuple(int(s) for s in normalized_shape)
    except TypeError:
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}") from None


def _check_param(p, name, nshape, dt, fn):
    if p is None:
        return None
    p = _as_device(p, f"{fn}: {name}")
    if tuple(p.shape) != nshape:
        raise ValueError(f"{fn}: {name} has shape {tuple(p.shape)}, expected normalized_shape {nshape}")
    _dtypes.check_dtype(p.dtype, _wtypes(dt), f"{fn}: {name} (with input dtype {dt})")
    return p


def _geometry(itemsize: int, hidden: int, smem_budget: int = 0):
    """Row geometry shared by the kernels: (G threads per row, nchunks, smem_chunks).

    A row is at most ``hidden // VEC`` aligned 16-byte vectors (VEC = 16 / itemsize) plus < VEC head and < VEC
    tail scalars. Thread t owns vectors ``k * G + t`` for chunks ``k < nchunks``: the first NV in registers,
    the next ``smem_chunks`` in shared memory (``smem_budget`` bytes), any others re-read in the second pass.
    G is a multiple of 32 in [32, MAX_THREADS], just enough to hold the row in NV chunks where it can.
    """
    body = hidden // (16 // itemsize)
    G = min(MAX_THREADS, max(32, 32 * math.ceil(math.ceil(body / NV) / 32)))
    nchunks = math.ceil(body / G)
    smem_chunks = min(max(0, nchunks - NV), max(0, smem_budget) // (G * 16))
    return G, nchunks, smem_chunks


_FWD_CFG: dict = {}


def _fwd_config(kind, dt, wdt, hidden, res, dev):
    """(kernel, threads per row G, nchunks, smem_chunks, dynamic smem bytes) for one row length."""
    key = (kind, dt, wdt, hidden, res, dev)
    cfg = _FWD_CFG.get(key)
    if cfg is None:
        budget = _compile.max_shared_optin(dev) - 1024  # static shared memory of the reductions
        G, nchunks, smem_chunks = _geometry(dt.itemsize, hidden, budget)
        kern = _compile.get_kernel(_SRC, _fwd_name(dt, wdt, kind, res))
        cfg = _FWD_CFG[key] = (kern, G, nchunks, smem_chunks, smem_chunks * G * 16)
    return cfg


def _forward(kind, fn, x, normalized_shape, weight, bias, eps, residual, return_stats):
    cp = _cupy()
    x = _as_device(x, f"{fn}: x")
    dt = _dtypes.check_dtype(x.dtype, _TYPES, f"{fn}: x")
    nshape = _normalized_shape(normalized_shape)
    nd = len(nshape)
    if nd == 0 or nd > x.ndim or tuple(x.shape[x.ndim - nd:]) != nshape:
        raise ValueError(f"{fn}: normalized_shape {nshape} must be the trailing dims of x.shape {tuple(x.shape)}")
    hidden = math.prod(nshape)
    if hidden == 0:
        raise ValueError(f"{fn}: normalized_shape {nshape} has no elements; the statistics are undefined")
    if hidden >= 2**31:
        raise ValueError(f"{fn}: normalized_shape {nshape} has {hidden} elements; at most 2**31 - 1 supported")
    weight = _check_param(weight, "weight", nshape, dt, fn)
    bias = _check_param(bias, "bias", nshape, dt, fn)
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise TypeError(f"{fn}: weight ({weight.dtype}) and bias ({bias.dtype}) must have the same dtype")
    wdt = weight.dtype if weight is not None else bias.dtype if bias is not None else dt
    if residual is not None:
        residual = _as_device(residual, f"{fn}: residual")
        if residual.shape != x.shape:
            raise ValueError(f"{fn}: residual has shape {tuple(residual.shape)}; expected that of x, {tuple(x.shape)}")
        if residual.dtype != dt:
            raise TypeError(f"{fn}: residual has dtype {residual.dtype}; expected that of x, {dt}")
    eps = float(eps)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"{fn}: eps must be finite and >= 0, got {eps}")

    rows = x.size // hidden
    stat_shape = x.shape[: x.ndim - nd]
    y = cp.empty(x.shape, dt)
    h = cp.empty(x.shape, dt) if residual is not None else None
    mean = cp.empty(stat_shape, np.float32) if (return_stats and kind == LAYER) else None
    rstd = cp.empty(stat_shape, np.float32) if return_stats else None
    if rows:
        x = _aligned(x)
        if residual is not None:
            residual = _aligned(residual)
        a = 32 if wdt.itemsize * (16 // dt.itemsize) > 16 else 16
        weight = _aligned(weight, a) if weight is not None else None
        bias = _aligned(bias, a) if bias is not None else None
        dev = x.device.id
        kern, G, nchunks, smem_chunks, smem = _fwd_config(kind, dt, np.dtype(wdt), hidden, residual is not None, dev)
        grid = min(rows, 1 << 22)
        _compile.launch(kern, (grid,), (G,),
                        (x, residual if residual is not None else _NULL, weight if weight is not None else _NULL,
                         bias if bias is not None else _NULL, y, h if h is not None else _NULL,
                         mean if mean is not None else _NULL, rstd if rstd is not None else _NULL,
                         np.int64(rows), np.int32(hidden), np.float32(eps), np.int32(nchunks),
                         np.int32(smem_chunks)),
                        shared_mem=smem, what=f"{fn} hidden={hidden} {dt}")
    out = (y,) if h is None else (y, h)
    if return_stats:
        out = out + ((mean, rstd) if kind == LAYER else (rstd,))
    return out[0] if len(out) == 1 else out


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, residual=None, return_stats=False):
    """LayerNorm over the trailing ``normalized_shape`` dims, optionally fused with the residual add.

    ``y = (h - mean) * rstd * weight + bias`` with ``h = x`` (or ``h = x + residual`` rounded to ``x.dtype``),
    ``mean`` and the biased variance ``var`` over the normalised dims, ``rstd = 1 / sqrt(max(var, 0) + eps)``.

    Args:
        x: CuPy array ``(..., *normalized_shape)``, float32 / float16 / bfloat16 (any strides; copied to
            contiguous if needed).
        normalized_shape: int or tuple, the trailing dims of ``x`` (at least one element).
        weight, bias: ``normalized_shape`` arrays in float32 or ``x.dtype`` (both the same dtype), or None.
        eps: added to the variance (float >= 0).
        residual: optional array like ``x``; then ``h = x + residual`` is computed once and returned as the new
            residual stream, and ``y`` normalises exactly that (rounded) ``h``.
        return_stats: also return the float32 ``mean`` and ``rstd`` of shape ``x.shape[:-len(normalized_shape)]``.

    Returns:
        ``y`` (``x.dtype``, shape of ``x``); with ``residual``: ``(y, h)``; with ``return_stats``:
        ``(y, mean, rstd)``, or ``(y, h, mean, rstd)`` with ``residual``.

    Raises:
        TypeError: non-CuPy input, unsupported dtypes, weight/bias dtype other than float32 or ``x.dtype``.
        TypeError also for a residual of another dtype than ``x``.
        ValueError: ``normalized_shape`` not the trailing dims of ``x`` or empty, weight/bias/residual shape
            mismatch, negative eps. All before any launch.
    """
    return _forward(LAYER, "layer_norm", x, normalized_shape, weight, bias, eps, residual, return_stats)


def rms_norm(x, normalized_shape, weight=None, eps=None, *, residual=None, return_stats=False):
    """RMSNorm over the trailing ``normalized_shape`` dims, optionally fused with the residual add.

    ``y = h * rstd * weight``, ``rstd = 1 / sqrt(mean(h^2) + eps)`` with ``h^2`` accumulated in float32;
    ``eps=None`` means ``finfo(x.dtype).eps`` (as ``torch.nn.functional.rms_norm``).

    Returns ``y``; with ``residual``: ``(y, h)``; with ``return_stats``: ``(y, rstd)`` or ``(y, h, rstd)``
    (``rstd`` float32, shape ``x.shape[:-len(normalized_shape)]``). Arguments, dtypes and errors as
    :func:`layer_norm`.
    """
    if eps is None:
        x = _as_device(x, "rms_norm: x")
        eps = _dtypes.eps(_dtypes.check_dtype(x.dtype, _TYPES, "rms_norm: x"))
    return _forward(RMS, "rms_norm", x, normalized_shape, weight, None, eps, residual, return_stats)


# ------------------------------------------------------------------------------------------------------------
# backward
_BWD_CFG: dict = {}


def _bwd_config(kind, dt, wdt, hidden, has_w, dev):
    key = (kind, dt, wdt, hidden, has_w, dev)
    cfg = _BWD_CFG.get(key)
    if cfg is not None:
        return cfg
    cp = _cupy()
    G, nchunks, _ = _geometry(dt.itemsize, hidden)
    acc_row = 4 * hidden  # bytes of one accumulator region
    nacc = int(has_w) + int(kind == LAYER)
    rows_per_block = 1
    if G == 32:  # a warp per row: several rows per block share the final partial row
        for r in (8, 4, 2):
            if r * nacc * acc_row <= 64 * 1024:
                rows_per_block = r
                break
    budget = _compile.max_shared_optin(dev) - 1024
    smem = 0
    dw_global = db_global = 0
    if has_w:
        if rows_per_block * acc_row <= budget - smem:
            smem += rows_per_block * acc_row
        else:
            dw_global = 1
    if kind == LAYER:
        if rows_per_block * acc_row <= budget - smem:
            smem += rows_per_block * acc_row
        else:
            db_global = 1
    kern = _compile.get_kernel(_SRC, _bwd_name(dt, wdt, kind))
    threads = G * rows_per_block
    props = cp.cuda.runtime.getDeviceProperties(dev)
    regs = max(32, int(getattr(kern, "num_regs", 64) or 64))
    by_regs = props.get("regsPerMultiprocessor", 65536) // (8 * math.ceil(regs / 8) * threads)
    by_threads = props.get("maxThreadsPerMultiProcessor", 2048) // threads
    by_smem = props.get("sharedMemPerMultiprocessor", budget + 1024) // (smem + 1024 + 512)
    per_sm = max(1, min(32, by_regs, by_threads, by_smem))
    cfg = _BWD_CFG[key] = (kern, G, rows_per_block, nchunks, smem, dw_global, db_global,
                           per_sm * _compile.sm_count(dev))
    return cfg


def _backward(kind, fn, dy, x, weight, mean, rstd):
    cp = _cupy()
    dy = _as_device(dy, f"{fn}: dy")
    x = _as_device(x, f"{fn}: x")
    dt = _dtypes.check_dtype(x.dtype, _TYPES, f"{fn}: x")
    if dy.shape != x.shape:
        raise ValueError(f"{fn}: dy has shape {tuple(dy.shape)}; expected that of x, {tuple(x.shape)}")
    if dy.dtype != dt:
        raise TypeError(f"{fn}: dy has dtype {dy.dtype}; expected that of x, {dt}")
    rstd = _as_device(rstd, f"{fn}: rstd")
    k = rstd.ndim
    if k >= x.ndim or tuple(rstd.shape) != tuple(x.shape[:k]):
        raise ValueError(f"{fn}: rstd has shape {tuple(rstd.shape)}; expected the leading dims of x.shape "
                         f"{tuple(x.shape)} (x.shape minus normalized_shape)")
    _dtypes.check_dtype(rstd.dtype, (_dtypes.float32,), f"{fn}: rstd")
    if kind == LAYER:
        mean = _as_device(mean, f"{fn}: mean")
        if mean.shape != rstd.shape:
            raise ValueError(f"{fn}: mean has shape {tuple(mean.shape)}, rstd {tuple(rstd.shape)}; they must match")
        _dtypes.check_dtype(mean.dtype, (_dtypes.float32,), f"{fn}: mean")
    nshape = tuple(x.shape[k:])
    hidden = math.prod(nshape)
    if hidden == 0 or hidden >= 2**31:
        raise ValueError(f"{fn}: normalized shape {nshape} has {hidden} elements; 1 .. 2**31 - 1 supported")
    weight = _check_param(weight, "weight", nshape, dt, fn)
    wdt = np.dtype(weight.dtype) if weight is not None else dt
    rows = x.size // hidden
    dx = cp.empty(x.shape, dt)
    dw_dt = wdt
    db_dt = wdt if weight is not None else _dtypes.float32  # no parameter dtype to follow: keep the float32 sum
    if rows == 0:
        dw = cp.zeros(nshape, dw_dt) if weight is not None else None
        db = cp.zeros(nshape, db_dt) if kind == LAYER else None
        return (dx, dw, db) if kind == LAYER else (dx, dw)
    x, dy = _aligned(x), _aligned(dy)
    rstd = cp.ascontiguousarray(rstd)
    if kind == LAYER:
        mean = cp.ascontiguousarray(mean)
    if weight is not None:
        weight = _aligned(weight, 32 if wdt.itemsize * (16 // dt.itemsize) > 16 else 16)
    dev = x.device.id
    kern, G, rpb, nchunks, smem, dw_global, db_global, max_blocks = _bwd_config(
        kind, dt, wdt, hidden, weight is not None, dev)
    nb = max(1, min(math.ceil(rows / rpb), max_blocks))
    ws_dw = cp.empty((nb, hidden), np.float32) if weight is not None else None
    ws_db = cp.empty((nb, hidden), np.float32) if kind == LAYER else None
    _compile.launch(kern, (nb,), (G * rpb,),
                    (dy, x, weight if weight is not None else _NULL, mean if kind == LAYER else _NULL, rstd, dx,
                     ws_dw if ws_dw is not None else _NULL, ws_db if ws_db is not None else _NULL,
                     np.int64(rows), np.int32(hidden), np.int32(nchunks), np.int32(G), np.int32(dw_global),
                     np.int32(db_global)),
                    shared_mem=smem, what=f"{fn} hidden={hidden} {dt}")
    dw = db = None
    rgrid = (math.ceil(hidden / 32),)
    if ws_dw is not None:
        dw = cp.empty(nshape, dw_dt)
        _compile.launch(_compile.get_kernel(_SRC, _red_name(dw_dt)), rgrid, (1024,),
                        (ws_dw, dw, np.int32(nb), np.int32(hidden)))
    if ws_db is not None:
        db = cp.empty(nshape, db_dt)
        _compile.launch(_compile.get_kernel(_SRC, _red_name(db_dt)), rgrid, (1024,),
                        (ws_db, db, np.int32(nb), np.int32(hidden)))
    return (dx, dw, db) if kind == LAYER else (dx, dw)


def layer_norm_backward(dy, x, weight, mean, rstd):
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``.

    With ``xhat = (x - mean) * rstd``, ``g = dy * weight``:
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` (means over the normalised dims),
    ``dweight = sum_rows dy * xhat``, ``dbias = sum_rows dy``, reduced in float32: per-block partial column
    sums into a ``[nblocks, hidden]`` workspace, then a second kernel sums the blocks in a fixed order
    (deterministic, no atomics).

    Args:
        dy, x: same shape and dtype (float32 / float16 / bfloat16); ``x`` is the normalised input (``h`` when
            the forward had a residual; ``dx`` is then also the gradient of ``x`` and of ``residual``).
        weight: ``normalized_shape`` array (float32 or ``x.dtype``) or None (then ``g = dy``, dweight None).
        mean, rstd: float32 statistics from ``layer_norm(..., return_stats=True)``; their shape (the leading
            dims of ``x``) fixes ``normalized_shape = x.shape[mean.ndim:]``.

    Returns:
        ``dx`` (``x.dtype``), ``dweight`` (weight's dtype, or None), ``dbias`` (weight's dtype; float32 when
        ``weight`` is None). Raises TypeError / ValueError on bad dtypes / shapes before any launch.
    """
    return _backward(LAYER, "layer_norm_backward", dy, x, weight, mean, rstd)


def rms_norm_backward(dy, x, weight, rstd):
    """Gradients of :func:`rms_norm`: ``(dx, dweight)``.

    With ``xhat = x * rstd``, ``g = dy * weight``: ``dx = rstd * (g - xhat * mean(g * xhat))``,
    ``dweight = sum_rows dy * xhat`` (float32 partials, deterministic second reduction). ``rstd`` float32 of
    shape ``x.shape[:k]`` fixes the normalised dims; ``dweight`` is None when ``weight`` is None. Errors as
    :func:`layer_norm_backward`.
    """
    return _backward(RMS, "rms_norm_backward", dy, x, weight, None, rstd)
