"""Numerics lab helpers: float-format constants, precision emulation in NumPy, and a partitioned GPU reduction.

* :func:`format_info` derives a format's constants (exponent/mantissa bits, largest finite, smallest normal and
  subnormal, machine epsilon, decimal digits) from its bit layout — IEEE 754 rules plus the float8 "fn"
  convention (no infinities, one NaN mantissa pattern; Micikevicius et al., *FP8 Formats for Deep Learning*,
  2022) — so the tests can check them against ``ml_dtypes.finfo`` / ``numpy.finfo`` and against brute-force
  enumeration of every bit pattern.
* NumPy emulation: every operation in a chosen precision, each result rounded to it (NumPy float16 and ml_dtypes
  compute one operation in float32 and round; for + - * / of formats with p <= 11 this double rounding is
  innocuous, 2p + 2 <= 24). Sequential reductions (:func:`sequential_sum`), the three variance algorithms
  (:func:`variance`: sum/sum-of-squares, two-pass, Welford — Welford 1962, Chan, Golub & LeVeque 1983) and the
  three softmax algorithms (:func:`softmax_emulated`: naive, safe, online — Milakov & Gimelshein 2018).
* :func:`partitioned_reduce` — sum or logsumexp of each row on the GPU with the split as parameters (elements
  per thread, threads per block, blocks per row, merge tree); ``cuda_src/reduce_study.cu``.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from . import _compile, _dtypes

FORMATS = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
# (exponent bits, explicit mantissa bits, has_inf, nan_only_all_ones ("fn": top exponent holds normal numbers))
_LAYOUT = {
    "float64": (11, 52, True, False),
    "float32": (8, 23, True, False),
    "float16": (5, 10, True, False),
    "bfloat16": (8, 7, True, False),
    "float8_e4m3fn": (4, 3, False, True),
    "float8_e5m2": (5, 2, True, False),
}


def format_info(dtype) -> dict:
    """Constants of a binary floating-point format, derived from its bit layout (not read from finfo).

    Returns name, bits, exponent_bits, mantissa_bits (explicit fraction bits; precision p = mantissa_bits + 1),
    bias, max (largest finite), smallest_normal, smallest_subnormal, eps (2^-mantissa_bits, the gap above 1),
    unit_roundoff (eps/2), decimal_digits (p·log10 2), range_decades (log10 max/smallest_subnormal), has_inf.
    Raises TypeError for a dtype that is not one of the known formats.
    """
    dt = np.dtype(dtype)
    name = dt.name
    if name not in _LAYOUT:
        raise TypeError(f"unknown float format {dt}; known: {', '.join(_LAYOUT)}")
    e, m, has_inf, fn = _LAYOUT[name]
    bias = 2 ** (e - 1) - 1
    if fn:  # top exponent is a normal binade; its all-ones mantissa is NaN
        emax = (2 ** e - 1) - bias
        max_frac = 2.0 - 2.0 ** (1 - m)  # 1.11..10
    else:
        emax = (2 ** e - 2) - bias
        max_frac = 2.0 - 2.0 ** (-m)
    p = m + 1
    info = {
        "name": name, "bits": 1 + e + m, "exponent_bits": e, "mantissa_bits": m, "precision_bits": p, "bias": bias,
        "max": math.ldexp(max_frac, emax), "smallest_normal": math.ldexp(1.0, 1 - bias),
        "smallest_subnormal": math.ldexp(1.0, 1 - bias - m), "eps": math.ldexp(1.0, -m),
        "unit_roundoff": math.ldexp(1.0, -p), "decimal_digits": p * math.log10(2.0), "has_inf": has_inf,
    }
    info["range_decades"] = math.log10(info["max"] / info["smallest_subnormal"])
    return info


def format_table(names=None) -> list[dict]:
    """:func:`format_info` for each format in ``FORMATS`` (or the given names)."""
    return [format_info(FORMATS[n]) for n in (names or FORMATS)]


# ----------------------------------------------------------------------------------------------------------
# NumPy emulation of a precision
def round_to(x, dtype) -> np.ndarray:
    """``x`` rounded to ``dtype`` (round to nearest even), returned as float64."""
    x = np.asarray(x, dtype=np.float64)
    dt = np.dtype(dtype)
    if dt == np.float64:
        return x.copy()
    if dt != np.float32 and dt != np.float16:
        x = x.astype(np.float32)  # ml_dtypes rounds from float32; the float64->float32 step is exact enough
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dt).astype(np.float64)


def sequential_sum(x, dtype=np.float32, axis=-1):
    """Left-to-right sum along ``axis`` with every partial sum rounded to ``dtype`` (vectorised over the rest)."""
    x = np.moveaxis(np.asarray(x), axis, -1).astype(dtype)
    s = np.zeros(x.shape[:-1], dtype=dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(x.shape[-1]):
            s = (s + x[..., j]).astype(dtype)
    return s


def variance(x, method: str, dtype=np.float32) -> np.ndarray:
    """Population variance of each row of 2-D ``x`` with arithmetic in ``dtype`` (input first rounded to it).

    method: ``"sumsq"`` (E[x^2] - E[x]^2, one pass, cancels catastrophically when |mean| >> std),
    ``"two_pass"`` (mean first, then mean of squared deviations) or ``"welford"`` (Welford 1962 running update).
    Returns float64 values of the ``dtype`` results.
    """
    dt = np.dtype(dtype)
    x = np.asarray(x).astype(dt)
    rows, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        if method == "sumsq":
            s = np.zeros(rows, dt)
            q = np.zeros(rows, dt)
            for j in range(n):
                c = x[:, j]
                s = (s + c).astype(dt)
                q = (q + (c * c).astype(dt)).astype(dt)
            mean = (s / dt.type(n)).astype(dt)
            var = (q / dt.type(n) - (mean * mean).astype(dt)).astype(dt)
        elif method == "two_pass":
            s = np.zeros(rows, dt)
            for j in range(n):
                s = (s + x[:, j]).astype(dt)
            mean = (s / dt.type(n)).astype(dt)
            q = np.zeros(rows, dt)
            for j in range(n):
                d = (x[:, j] - mean).astype(dt)
                q = (q + (d * d).astype(dt)).astype(dt)
            var = (q / dt.type(n)).astype(dt)
        elif method == "welford":
            mean = np.zeros(rows, dt)
            m2 = np.zeros(rows, dt)
            for j in range(n):
                c = x[:, j]
                d = (c - mean).astype(dt)
                mean = (mean + (d / dt.type(j + 1)).astype(dt)).astype(dt)
                m2 = (m2 + (d * (c - mean).astype(dt)).astype(dt)).astype(dt)
            var = (m2 / dt.type(n)).astype(dt)
        else:
            raise ValueError(f"unknown variance method {method!r}; expected 'sumsq', 'two_pass' or 'welford'")
    return var.astype(np.float64)


def softmax_emulated(x, method: str, dtype) -> np.ndarray:
    """Row softmax of 2-D ``x`` with every operation (exp, sum, max, divide) in ``dtype``; float64 result.

    ``"naive"``: exp(x) / sum exp(x) — overflows once exp(max x) (or the sum) exceeds the format's max.
    ``"safe"``: subtract the row max first. ``"online"``: one pass keeping (m, l), l rescaled by exp(m_old - m).
    """
    dt = np.dtype(dtype)
    x = np.asarray(x).astype(dt)
    rows, n = x.shape
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if method == "naive":
            e = np.exp(x).astype(dt)
            s = sequential_sum(e, dt)
            y = (e / s[:, None]).astype(dt)
        elif method == "safe":
            m = x.max(axis=1)
            e = np.exp((x - m[:, None]).astype(dt)).astype(dt)
            s = sequential_sum(e, dt)
            y = (e / s[:, None]).astype(dt)
        elif method == "online":
            m = x[:, 0].copy()  # start from the first element: float8 e4m3fn cannot hold -inf
            l = np.ones(rows, dtype=dt)
            for j in range(1, n):
                c = x[:, j]
                mn = np.maximum(m, c)
                l = ((l * np.exp((m - mn).astype(dt)).astype(dt)).astype(dt)
                     + np.exp((c - mn).astype(dt)).astype(dt)).astype(dt)
                m = mn
            y = (np.exp((x - m[:, None]).astype(dt)).astype(dt) / l[:, None]).astype(dt)
        else:
            raise ValueError(f"unknown softmax method {method!r}; expected 'naive', 'safe' or 'online'")
    return y.astype(np.float64)


# ----------------------------------------------------------------------------------------------------------
# Partitioned GPU reduction (reduce_study.cu)
SOURCE = "reduce_study.cu"
_OPS = {"sum": 0, "logsumexp": 1}
_TREES = {"sequential": 0, "butterfly": 1}
_IN_DTYPES = (_dtypes.float32, _dtypes.float16, _dtypes.bfloat16)
_PARTIAL = {(dt, op): f"partial_reduce<{_dtypes.ctype(dt)}, {op}>" for dt in _IN_DTYPES for op in (0, 1)}
_MERGE = {op: f"merge_partials<{op}>" for op in (0, 1)}
_compile.declare(SOURCE, list(_PARTIAL.values()) + list(_MERGE.values()), release=False)


def partitioned_reduce(x, op: str = "sum", *, ept: int = 1, threads: int = 256, blocks_per_row: int = 1,
                       tree: str = "butterfly"):
    """Sum or logsumexp over the last axis of a 2-D CuPy array, with the reduction order as parameters.

    Parameters
    ----------
    x : CuPy array (rows, n), float32/float16/bfloat16, last axis contiguous.
    op : "sum" or "logsumexp".
    ept : elements per thread (consecutive elements a thread adds in sequence), >= 1.
    threads : threads per block, a multiple of 32 in [32, 1024].
    blocks_per_row : contiguous segments per row, one block each, >= 1.
    tree : "sequential" (left-to-right merges) or "butterfly" (shuffle-xor butterfly in the block, pairwise
        tree across blocks).

    Returns a float32 CuPy array (rows,). Accumulation in float32. Raises TypeError/ValueError on bad input.
    """
    import cupy

    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"x must be a CuPy array, got {type(x).__name__}")
    _dtypes.check_dtype(x.dtype, _IN_DTYPES, "x")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (rows, n), got shape {x.shape}")
    if op not in _OPS:
        raise ValueError(f"op must be 'sum' or 'logsumexp', got {op!r}")
    if tree not in _TREES:
        raise ValueError(f"tree must be 'sequential' or 'butterfly', got {tree!r}")
    if not (32 <= threads <= 1024 and threads % 32 == 0):
        raise ValueError(f"threads must be a multiple of 32 in [32, 1024], got {threads}")
    if ept < 1 or blocks_per_row < 1:
        raise ValueError(f"ept and blocks_per_row must be >= 1, got {ept}, {blocks_per_row}")
    rows, n = x.shape
    if x.strides[1] != x.itemsize:
        x = cupy.ascontiguousarray(x)
    out = cupy.empty(rows, dtype=np.float32)
    if rows == 0:
        return out
    o = _OPS[op]
    ws = cupy.empty(rows * blocks_per_row * (1 + o), dtype=np.float32)
    k1 = _compile.get_kernel(SOURCE, _PARTIAL[(x.dtype, o)])
    _compile.launch(k1, (rows * blocks_per_row,), (threads,),
                    (x, np.int64(n), np.int64(x.strides[0] // x.itemsize), np.int32(blocks_per_row), np.int32(ept),
                     np.int32(_TREES[tree]), ws))
    k2 = _compile.get_kernel(SOURCE, _MERGE[o])
    _compile.launch(k2, (-(-rows // 128),), (128,),
                    (ws, np.int64(rows), np.int32(blocks_per_row), np.int32(_TREES[tree]), out))
    return out
