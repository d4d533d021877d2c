"""Input handling shared by every attention path (FA-2 forward, FA-1 forward, standard, backward).

``prepare(q, k, v, causal, softmax_scale, window_size)`` validates and normalises the arguments before any
launch and returns an :class:`AttnProblem`: shapes, the softmax scale, the window in key coordinates and the
element strides the kernels index with. Layout is (batch, heads, seqlen, head_dim) with any strides; only the
head_dim axis must be contiguous (a view that is not gets one copy). Masks are aligned to the bottom-right
corner (FlashAttention >= 2.1): query row ``i`` sits at key position ``i + seqlen_k - seqlen_q``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _compile, _dtypes

NATIVE_HEAD_DIMS = (32, 64, 96, 128, 256)
DTYPES = (_dtypes.float16, _dtypes.bfloat16, _dtypes.float32)


def as_cupy(x, name: str):
    """A CuPy view of ``x`` (CuPy array, DLPack or __cuda_array_interface__ object, e.g. a torch CUDA tensor).

    A view whose elements are not aligned to their size (byte strides that are not whole elements, or a start
    address that is not a multiple of the item size: a reinterpreting ``.view`` of a byte array) is copied to a
    contiguous array byte by byte: the kernels index in elements, and no kernel (CuPy's included) may load a
    misaligned element."""
    import cupy

    if not isinstance(x, cupy.ndarray):
        x = _foreign(x, name)
    it = x.itemsize
    if x.size and (x.data.ptr % it or any(st % it for st in x.strides)):
        raw = cupy.ndarray(x.shape + (it,), cupy.uint8, memptr=x.data, strides=x.strides + (1,))
        x = cupy.ascontiguousarray(raw).view(x.dtype).reshape(x.shape)
    return x


def _foreign(x, name: str):
    """as_cupy for what is not a CuPy array: DLPack / __cuda_array_interface__ objects; host arrays raise."""
    import cupy

    def has(attr):  # torch raises (rather than returning False) for some tensors, e.g. requires_grad=True
        try:
            return hasattr(x, attr)
        except Exception:
            return False

    if type(x).__module__ == "numpy" or has("__array_interface__") and not has("__cuda_array_interface__"):
        raise TypeError(f"{name} must be a CuPy array on the GPU, got a host {type(x).__name__}; "
                        f"move it to the GPU first (cupy.asarray)")
    if has("__dlpack__") or has("__cuda_array_interface__"):
        try:
            return cupy.from_dlpack(x) if has("__dlpack__") else cupy.asarray(x)
        except Exception as e:  # pragma: no cover - depends on the producer
            raise TypeError(f"{name}: could not view {type(x).__name__} as a CuPy array: {e}") from None
    raise TypeError(f"{name} must be a CuPy array (or a CUDA array via DLPack / __cuda_array_interface__), "
                    f"got {type(x).__name__}")


def padded_head_dim(d: int) -> int:
    """The smallest native head_dim >= d (head_dims that are not native are zero-padded to it)."""
    for n in NATIVE_HEAD_DIMS:
        if d <= n:
            return n
    raise ValueError(f"head_dim {d} > 256 is not supported")


def as_int(v, what: str) -> int:
    """``v`` as a Python int: ints and NumPy integers only (a float, string or bool raises TypeError)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {_short(v)} ({type(v).__name__})")
    return int(v)


# The smallest magnitude that rounds to infinity in float32 (round to nearest even): 2^128 - 2^103, halfway between
# float32's largest finite value (2^128 - 2^104) and 2^128; below it a double rounds to a finite float32.
_F32_OVERFLOW = 2.0**128 - 2.0**103


def as_float(v, what: str) -> float:
    """``v`` as a Python float that is finite in float32 (the kernels take float32): ints, floats and NumPy /
    ml_dtypes real scalars; a bool, string or complex raises TypeError, NaN, inf or a value beyond float32's range
    ValueError."""
    real = isinstance(v, (int, float, np.integer, np.floating)) or (
        isinstance(v, np.generic) and v.dtype == _dtypes.bfloat16)  # ml_dtypes' scalar: not an np.floating
    if not real or isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{what} must be a real number, got {_short(v)} ({type(v).__name__})")
    f = float(v)
    if not abs(f) < _F32_OVERFLOW:  # (NaN too)
        raise ValueError(f"{what} must be finite in float32, got {v!r}")
    return f


def _short(v) -> str:
    """``v`` for an error message: an array by its shape and dtype (its repr would copy a device array to the host),
    anything else by a repr cut at 60 characters."""
    if hasattr(v, "shape") and hasattr(v, "dtype") and getattr(v, "ndim", 0) > 0:
        return f"an array of shape {tuple(v.shape)} and dtype {v.dtype}"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def as_bool(v, what: str) -> bool:
    """``v`` as a Python bool: bools, NumPy bools and the ints 0 / 1 only (``causal="no"`` raises TypeError)."""
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
        return bool(v)
    raise TypeError(f"{what} must be a bool, got {_short(v)} ({type(v).__name__})")


def head_dim_text(head_dim: int, padded: int) -> str:
    """The head_dim an error message names: the caller's, and the padded one the kernels run when it differs."""
    return f"head_dim {head_dim}" if padded == head_dim else f"head_dim {head_dim} (padded to {padded})"


def parse_block_sizes(block_sizes, lengths=(2,)) -> tuple[int, ...]:
    """``block_sizes`` as a tuple of ints of one of ``lengths`` ((Br, Bc), or (Br, Bc, warps) where allowed);
    anything else (a string, floats, another length) raises ValueError naming it."""
    what = " or ".join({2: "(Br, Bc)", 3: "(Br, Bc, warps)"}[n] for n in lengths)
    try:
        if isinstance(block_sizes, (str, bytes)):
            raise TypeError
        bs = tuple(as_int(x, "block_sizes entry") for x in block_sizes)
    except TypeError:
        bs = ()
    if len(bs) not in lengths:
        raise ValueError(f"block_sizes must be {what} of ints, got {block_sizes!r}")
    return bs


def normalize_window(causal: bool, window_size, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """(left, right) in keys, -1 = unbounded; causal sets right = 0. A bound of seqlen_q + seqlen_k or more
    excludes no key and becomes -1 (the kernels' int32 index arithmetic stays far from overflow). Raises
    TypeError for non-int entries, ValueError for entries < -1 or not a pair."""
    if isinstance(window_size, (str, bytes, dict, set, frozenset)):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    try:
        pair = tuple(window_size)
    except TypeError:
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}") from None
    if len(pair) != 2:
        raise ValueError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    left, right = (as_int(w, "window_size entry") for w in pair)
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1, got {window_size!r}")
    wide = seqlen_q + seqlen_k
    left, right = (-1 if w >= wide else w for w in (left, right))
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


@dataclass
class AttnProblem:
    q: object
    k: object
    v: object
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int          # the user's head_dim
    head_dim_padded: int   # the kernel's (native) head_dim
    dtype: np.dtype
    softmax_scale: float
    causal: bool
    window: tuple[int, int]

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def key_range(self, q_start: int, q_end: int) -> tuple[int, int]:
        """Keys [lo, hi) that query rows [q_start, q_end) may see under the mask (empty when lo >= hi)."""
        shift = self.seqlen_k - self.seqlen_q
        left, right = self.window
        hi = self.seqlen_k if right < 0 else min(self.seqlen_k, q_end - 1 + shift + right + 1)
        lo = 0 if left < 0 else max(0, q_start + shift - left)
        return lo, hi


def strides_elems(a) -> tuple[int, int, int]:
    """(batch, head, seq) strides in elements of a 4-D array whose last axis is contiguous."""
    s = a.strides
    it = a.itemsize
    return s[0] // it, s[1] // it, s[2] // it


def aligned_contiguous(a, align: int = 16):
    """``a`` as a C-contiguous array whose data starts ``align``-byte aligned: ``a`` itself when it is one, else a
    copy (a fresh allocation is 256-byte aligned). ``cupy.ascontiguousarray`` alone returns a C-contiguous view as
    it is, even one starting inside a 16-byte slot (``flat[1:].reshape(...)``), whose vector loads and stores
    fault (cudaErrorMisalignedAddress)."""
    import cupy

    if not a.flags.c_contiguous:
        a = cupy.ascontiguousarray(a)
    return a if a.data.ptr % align == 0 else a.copy()


def last_axis_contiguous(a):
    """``a`` itself when its last axis is unit-stride and 16-byte aligned rows allow vector loads, else a copy."""
    it = a.itemsize
    ok = a.shape[-1] == 1 or a.strides[-1] == it
    ok = ok and all((st // it) % (16 // it) == 0 or n == 1 for st, n in zip(a.strides[:-1], a.shape[:-1]))
    ok = ok and a.data.ptr % 16 == 0
    return a if ok else aligned_contiguous(a)


def pad_head_dim(a, d_to: int):
    """Zero-pad the last axis of ``a`` to ``d_to`` (no copy when already that size)."""
    import cupy

    d = a.shape[-1]
    if d == d_to:
        return a
    out = cupy.zeros(a.shape[:-1] + (d_to,), dtype=a.dtype)
    out[..., :d] = a
    return out


def check_grid_yz(p: AttnProblem) -> None:
    """ValueError for more batches or heads_q than a grid dimension takes (65535): the tiled kernels launch
    (tiles, heads, batch) grids. Raised before any device query or allocation."""
    if max(p.batch, p.heads_q) > _compile.GRID_MAX[1]:
        raise ValueError(f"batch ({p.batch}) and heads_q ({p.heads_q}) must be at most {_compile.GRID_MAX[1]} (the "
                         f"kernels' grid.y / grid.z), got q {p.q.shape}")


def prepare(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), dtypes=DTYPES) -> AttnProblem:
    """Validate (batch, heads, seqlen, head_dim) inputs; raise TypeError/ValueError before any launch.

    Raises TypeError for non-arrays, unsupported or mixed dtypes, a non-bool ``causal``, non-int window entries or
    a ``softmax_scale`` that is not a real number; ValueError for wrong ranks, mismatched
    batch/seqlen/head_dim, heads_q not divisible by heads_kv, head_dim > 256 or < 1, sizes beyond 32-bit indexing,
    a bad window or a scale that is not finite in float32.
    """
    q, k, v = as_cupy(q, "q"), as_cupy(k, "k"), as_cupy(v, "v")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim != 4:
            raise ValueError(f"{name} must have shape (batch, heads, seqlen, head_dim), got {a.shape}")
    dt = _dtypes.check_dtype(q.dtype, dtypes, "q")
    if k.dtype != dt or v.dtype != dt:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, Sq, D = q.shape
    Bk, Hkv, Sk, Dk = k.shape
    if v.shape != k.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if Bk != B:
        raise ValueError(f"batch mismatch: q {q.shape} vs k {k.shape}")
    if Dk != D:
        raise ValueError(f"head_dim mismatch: q {q.shape} vs k {k.shape}")
    if D < 1 or D > 256:
        raise ValueError(f"head_dim must be in [1, 256], got {D} (q {q.shape})")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"heads_q ({Hq}) must be a multiple of heads_kv ({Hkv})")
    dev = q.device.id
    if k.device.id != dev or v.device.id != dev:
        raise ValueError("q, k, v must be on the same device")
    if max(B, Hq, Sq + Sk) >= 2**31:
        raise ValueError(f"batch, heads and seqlen_q + seqlen_k must be below 2^31 (the kernels index with 32-bit "
                         f"ints), got q {q.shape}, k {k.shape}")
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else as_float(softmax_scale, "softmax_scale")
    causal = as_bool(causal, "causal")
    window = normalize_window(causal, window_size, Sq, Sk)
    return AttnProblem(q, k, v, B, Hq, Hkv, Sq, Sk, D, padded_head_dim(D), dt, scale, causal, window)
