"""Dtypes: NumPy / ml_dtypes dtype <-> C++ type, and per-dtype tolerances.

bfloat16 is ``ml_dtypes.bfloat16`` (CuPy 14 accepts it). Kernels accumulate in float (double for float64).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

CTYPE = {float32: "float", float16: "__half", bfloat16: "__nv_bfloat16", float64: "double"}
HALF_TYPES = (float16, bfloat16)


def ctype(dtype) -> str:
    """The C++ type name of a supported dtype; TypeError otherwise."""
    dt = np.dtype(dtype)
    try:
        return CTYPE[dt]
    except KeyError:
        raise TypeError(f"unsupported dtype {dt}; expected one of float32, float16, bfloat16"
                        f"{', float64' if dt.kind == 'f' else ''}") from None


def check_dtype(dtype, allowed, what: str = "input") -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in allowed:
        names = ", ".join(str(np.dtype(a)) for a in allowed)
        raise TypeError(f"{what} has dtype {dt}; supported: {names}")
    return dt


def eps(dtype) -> float:
    """Machine epsilon (ml_dtypes.finfo handles bfloat16)."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).eps)


def tolerance(dtype, n: int = 1) -> tuple[float, float]:
    """(atol, rtol) for comparing a kernel output with a float64 reference.

    The output is rounded once to ``dtype`` (half an ulp, ``eps/2`` relative); the float32 accumulation over
    ``n`` terms adds about ``sqrt(n)·eps32`` (random rounding). A factor 4 of headroom on both.
    """
    e = eps(dtype)
    acc = (np.sqrt(max(n, 1)) * eps(np.float32)) if np.dtype(dtype) != float64 else np.sqrt(max(n, 1)) * 1e-16
    rtol = 4 * (e / 2 + acc)
    atol = rtol * 1e-2
    return float(atol), float(rtol)
