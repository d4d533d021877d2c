"""Attention forward: the FlashAttention-2 schedule on tensor cores (Dao 2023, arXiv:2307.08691, Algorithm 1).

``attention(q, k, v)`` computes ``softmax(q·kᵀ·softmax_scale + mask)·v`` per (batch, head) without ever writing
the (seqlen_q, seqlen_k) score matrix to HBM: Q tiles of ``Br`` rows stay on chip while K/V tiles of ``Bc`` keys
stream through shared memory, and an online softmax (running max ``m`` and sum ``l``, Milakov & Gimelshein 2018)
rescales the output accumulator. The kernels live in ``cuda_src/attention_fwd.cu``; the alternative schedules
(``"standard"``: S and P materialised in HBM; ``"fa1"``: FlashAttention-1, K/V tiles outermost, Dao et al. 2022)
live in ``cuflash/_attention_alt.py``.

Traffic of the FA-2 schedule per (batch, head): Q read once, K and V read once per Q tile
(2·ceil(seqlen_q/Br)·seqlen_k·d elements), O written once, lse written once (float32).
"""
from __future__ import annotations

import math

import numpy as np

from . import _attention_sm90, _compile, _dtypes
from ._attn_common import (NATIVE_HEAD_DIMS, as_bool, check_grid_yz, head_dim_text, last_axis_contiguous,
                           pad_head_dim, parse_block_sizes, prepare)

SOURCE = "attention_fwd.cu"
SCHEDULES = ("auto", "fa2", "fa1", "standard", "wgmma")
# schedule="auto" runs the Hopper wgmma kernel where it applies (cc 9.0, fp16/bf16, AUTO_WGMMA_MIN_HEAD_DIM <=
# head_dim <= 128, no block_sizes), else the FA-2 mma.sync kernel. Tests flip these to run the whole suite on
# both kernels.
AUTO_WGMMA = True
# schedule="auto" takes the wgmma kernel from this head_dim up. With its K/V loads by TMA the wgmma kernel is the
# faster one at head_dim 64 and 128 on the H200 (experiments/results/attention_bench.json); with the earlier
# cp.async producer the FA-2 kernel had won at 64 and this was 65.
AUTO_WGMMA_MIN_HEAD_DIM = 1
STAGES = 2
LOG2E = 1.4426950408889634
F32_WARPS = 8  # float32 path: query rows per block (one warp per row)

# Tuned default (Br, Bc, warps) per (head_dim, causal) for fp16/bf16 (H200 / A100 alike; sm_90 measured by
# experiments/tile_sweep.py: at head_dim 128, 128 x 32 with 4 warps ran 289 TFLOP/s against 251 for 128 x 64
# with 8 warps). Each warp owns Br / warps query rows (16 or 32: MT = 1 or 2 m16 tiles).
DEFAULT_TILES = {
    (32, False): (128, 64, 4), (32, True): (128, 64, 4),
    (64, False): (128, 64, 4), (64, True): (128, 64, 4),
    (96, False): (128, 64, 8), (96, True): (128, 64, 8),
    (128, False): (128, 32, 4), (128, True): (128, 32, 4),
    (256, False): (64, 64, 4), (256, True): (64, 64, 4),
}
# Extra (Br, Bc, warps) instantiated for the tile sweep / block_sizes (bfloat16 only, study configurations).
SWEEP_TILES = {64: [(64, 32, 4), (64, 64, 4), (64, 128, 4), (128, 32, 8), (128, 64, 8), (128, 128, 8),
                    (128, 32, 4), (128, 64, 4), (256, 64, 8)],
               128: [(64, 32, 4), (64, 64, 4), (64, 128, 4), (128, 32, 8), (128, 64, 8), (128, 128, 8),
                     (128, 32, 4)]}
SWEEP_DTYPE = _dtypes.bfloat16


def kernel_name(dtype, head_dim: int, Br: int, Bc: int, warps: int = 0, stages: int = STAGES) -> str:
    """C++ name expression of the tensor-core kernel (float16/bfloat16; warps = Br/16 when 0) or of the
    float32 SIMT kernel."""
    dt = np.dtype(dtype)
    if dt == _dtypes.float32:
        return f"cuflash::attention_fwd_f32<{head_dim}, {F32_WARPS}>"
    warps = warps or Br // 16
    mt = Br // (16 * warps)
    return f"cuflash::attention_fwd_kernel<{_dtypes.ctype(dt)}, {head_dim}, {Br}, {Bc}, {stages}, {mt}>"


def smem_bytes(dtype, head_dim: int, Br: int, Bc: int, stages: int = STAGES) -> int:
    """Dynamic shared memory of one block: Q tile + ``stages`` K and V tiles, rows padded by 8 elements."""
    dt = np.dtype(dtype)
    if dt == _dtypes.float32:
        return 4 * (32 * (head_dim + 1) + 32 * head_dim + F32_WARPS * head_dim + F32_WARPS * 32)
    ld = head_dim + 8
    return dt.itemsize * ld * (Br + 2 * stages * Bc)


def instantiated_tiles(dtype, head_dim: int) -> list[tuple[int, int, int]]:
    """Every (Br, Bc, warps) compiled for this (dtype, head_dim): the defaults, plus the sweep set for bf16."""
    tiles = {DEFAULT_TILES[(head_dim, c)] for c in (False, True)}
    if np.dtype(dtype) == SWEEP_DTYPE:
        tiles |= set(SWEEP_TILES.get(head_dim, []))
    return sorted(tiles)


def _declare():
    for d in NATIVE_HEAD_DIMS:
        _compile.declare(SOURCE, [kernel_name(_dtypes.float32, d, 0, 0)])
        for dt in (_dtypes.float16, _dtypes.bfloat16):
            release = {DEFAULT_TILES[(d, c)] for c in (False, True)}
            for cfg in instantiated_tiles(dt, d):
                _compile.declare(SOURCE, [kernel_name(dt, d, *cfg)], release=cfg in release)


_declare()


def flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal=False) -> float:
    """Forward FLOPs by the FlashAttention convention: 4·B·H·Sq·Sk·d (two matmuls), halved when causal."""
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return f / 2 if causal else f


def _device_text(a) -> str:
    """'device N (compute capability XY)' of the array's device, for error messages."""
    try:
        import cupy

        return f"device {a.device.id} (compute capability {cupy.cuda.Device(a.device.id).compute_capability})"
    except Exception:  # pragma: no cover - no driver
        return f"device {a.device.id}"


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), return_lse=False,
              schedule="auto", block_sizes=None):
    """Scaled dot-product attention forward, ``softmax(q kᵀ · softmax_scale + mask) v``.

    On compute capability 9.0 (float16 / bfloat16, head_dim <= 128) the default is the Hopper kernel after
    FlashAttention-3 (Shah et al. 2024; ``schedule="wgmma"``); elsewhere it follows FlashAttention-2 (Dao 2023,
    Algorithm 1), both with the online softmax of Milakov & Gimelshein 2018; ``"fa1"`` and ``"standard"`` are
    Algorithms 1 and 0 of FlashAttention (Dao et al. 2022).

    Parameters
    ----------
    q : (batch, heads_q, seqlen_q, head_dim) CuPy array, float16 / bfloat16 / float32, any strides (a
        (batch, seqlen, heads, head_dim) tensor's ``.transpose(0, 2, 1, 3)`` view works without a copy; only a
        non-unit last stride or rows not 16-byte aligned cost one copy).
    k, v : (batch, heads_kv, seqlen_k, head_dim), same dtype; heads_q % heads_kv == 0 (GQA / MQA: query head
        ``h`` reads key/value head ``h // (heads_q // heads_kv)``); seqlen_k may differ from seqlen_q.
    causal : mask keys after the query. With seqlen_q != seqlen_k the mask is aligned to the BOTTOM-RIGHT
        corner (FlashAttention >= 2.1): query row ``i`` sits at key position ``i + seqlen_k - seqlen_q`` and sees
        keys ``j <= i + seqlen_k - seqlen_q``. When seqlen_q > seqlen_k the first rows see no key at all.
    softmax_scale : float, default ``1/sqrt(head_dim)`` (of the caller's head_dim, also when it is padded).
    window_size : (left, right) local attention with the same alignment: row ``i`` sees keys
        ``i + shift - left <= j <= i + shift + right``; -1 = unbounded. ``causal`` sets right = 0.
    return_lse : also return ``lse``, float32 (batch, heads_q, seqlen_q): natural-log logsumexp of the scaled,
        masked scores of each row.
    schedule : ``"auto"`` (the ``"wgmma"`` kernel on compute capability 9.0 for float16/bfloat16 and head_dim <=
        128 when ``block_sizes`` is not given, else ``"fa2"``), ``"fa2"`` (this kernel), ``"fa1"``
        (FlashAttention-1 schedule, K/V tiles outermost), ``"standard"`` (the textbook version: S and P
        materialised in HBM, for the traffic comparison) or ``"wgmma"`` (the Hopper kernel of
        ``cuflash._attention_sm90``: warpgroup MMA, K/V by TMA, warp specialisation; cc 9.0 only).
    block_sizes : (Br, Bc) or (Br, Bc, warps) overriding the tuned tile choice of the fa2 kernel (fp16/bf16);
        ``"fa1"`` and ``"wgmma"`` take a pair of their own instantiated tiles; ``"standard"`` and the float32 path
        ignore it. Ints only; a configuration that is not instantiated or does not fit the device's shared memory
        raises ValueError naming it and the instantiated ones (the fa2 list: ``instantiated_tiles(dtype,
        head_dim)`` of the module ``cuflash.attention``, reached as ``sys.modules["cuflash.attention"]``, since
        ``cuflash.attention`` is this function).

    Returns
    -------
    out : (batch, heads_q, seqlen_q, head_dim), contiguous, q's dtype; ``(out, lse)`` with ``return_lse``.

    Semantics: masked scores are -inf (no finite sentinel); a query row that sees no key outputs exactly 0 and its
    lse is -inf. Non-finite inputs propagate as IEEE arithmetic makes them, as in FlashAttention and torch SDPA, and
    alike on every schedule: a NaN in q makes its row's out and lse NaN, a NaN or inf in k those of every row that
    sees that key (a score of inf less a row max of inf is NaN); a NaN or inf in a row of v
    reaches, through P·V with P = 0, the outputs of rows that cannot see that key when they share its K/V tile
    (fully masked rows included: then not 0), so padding or a KV cache beyond the window must hold finite values. head_dim 32, 64, 96, 128, 256 run natively (the Hopper kernel: 64 and 128); any other head_dim <=
    256 is zero-padded to the next native one (the scale stays that of the original head_dim; zero columns change
    neither q·k nor the kept part of the output). float16 / bfloat16 run on tensor cores (mma.sync m16n8k16, or
    wgmma on the Hopper kernel; float32 accumulators; P is rounded to the input dtype before P·V, as in
    FlashAttention). float32 input runs a SIMT kernel: exact fp32 arithmetic, not tensor cores (slower; error ~
    float32 rounding, far below the half-precision paths).
    The forward is deterministic: repeated calls give bitwise-identical out and lse.

    Raises
    ------
    TypeError : non-arrays (host arrays included), unsupported or mixed dtypes, a non-bool ``causal`` or
        ``return_lse``, a ``softmax_scale`` that is not a real number (a string, a bool), ``window_size`` not a
        pair (a dict, a set) or with non-int entries.
    ValueError : wrong ranks, k and v of different shapes, mismatched batch / head_dim, heads_q not a multiple
        of heads_kv, head_dim outside 1..256, q / k / v on different devices, batch, heads or seqlen_q +
        seqlen_k of 2^31 or more, more batches or heads than a grid dimension takes (65535; not for ``"fa1"`` and
        ``"standard"``, checked before any device query or allocation), a ``softmax_scale`` not finite in
        float32, ``window_size`` not a pair or an entry < -1, unknown schedule, ``"wgmma"`` where it does not apply
        (not cc 9.0, float32 or head_dim > 128), block_sizes malformed (floats included), not instantiated or
        not fitting the shared memory (``ConfigurationError``, a ValueError); ``"fa1"`` beyond its grid limits
        (more than 65535 Q tiles, or batch·heads_q too large).
    """
    p = prepare(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size)
    return_lse = as_bool(return_lse, "return_lse")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if block_sizes is not None:  # the format, on every schedule (the kernels check the values they instantiate)
        parse_block_sizes(block_sizes, (2, 3))
    if schedule not in ("fa1", "standard"):  # (fa1 maps batch x heads to grid.x; standard runs CuPy matmuls)
        check_grid_yz(p)
    if (schedule == "auto" and block_sizes is None and AUTO_WGMMA and p.head_dim >= AUTO_WGMMA_MIN_HEAD_DIM
            and _attention_sm90.supports(p)):
        schedule = "wgmma"  # the Hopper kernel is the default on compute capability 9.0
    if schedule == "wgmma":
        if not _attention_sm90.supports(p):
            raise ValueError(f"schedule 'wgmma' needs a compute capability 9.0 device, float16/bfloat16 and "
                             f"head_dim <= 128; got {_device_text(p.q)}, {p.dtype}, head_dim {p.head_dim}")
        out, lse = _attention_sm90.forward(p, block_sizes, return_lse=return_lse)
        return (out, lse) if return_lse else out
    if schedule == "standard":
        from ._attention_alt import standard_forward

        out, lse = standard_forward(p, return_lse)
        return (out, lse) if return_lse else out
    if schedule == "fa1":
        from ._attention_alt import fa1_forward

        out, lse = fa1_forward(p, block_sizes, return_lse)
        return (out, lse) if return_lse else out
    out, lse = fa2_forward(p, block_sizes)
    return (out, lse) if return_lse else out


def choose_tiles(p, block_sizes=None) -> tuple[int, int, int]:
    """(Br, Bc, warps) for problem ``p``: ``block_sizes`` = (Br, Bc) or (Br, Bc, warps) validated against the
    instantiated set (for (Br, Bc) the default warp count when instantiated, else the most warps), else the
    tuned default."""
    d = p.head_dim_padded
    if p.dtype == _dtypes.float32:
        return (F32_WARPS, 32, F32_WARPS)
    default = DEFAULT_TILES[(d, p.causal)]
    if block_sizes is None:
        return default
    bs = parse_block_sizes(block_sizes, (2, 3))
    avail = instantiated_tiles(p.dtype, d)
    match = [c for c in avail if c[:len(bs)] == bs]
    if not match:
        what = f"Br={bs[0]}, Bc={bs[1]}" + (f", warps={bs[2]}" if len(bs) == 3 else "")
        raise ValueError(f"block_sizes ({what}) is not an instantiated configuration for "
                         f"{head_dim_text(p.head_dim, d)}, {p.dtype}; available (Br, Bc, warps): {avail}")
    return default if default in match else max(match, key=lambda c: c[2])


def fa2_forward(p, block_sizes=None):
    """Run the FA-2 kernel on a prepared :class:`AttnProblem`; returns (out, lse)."""
    import cupy

    br, bc, warps = choose_tiles(p, block_sizes)
    d = p.head_dim_padded
    B, Hq, Sq, Sk = p.batch, p.heads_q, p.seqlen_q, p.seqlen_k
    dt = p.dtype
    name = kernel_name(dt, d, br, bc, warps)
    smem = smem_bytes(dt, d, br, bc)
    dev = cupy.cuda.runtime.getDevice()
    if smem > 48 * 1024 and smem > _compile.max_shared_optin(dev):
        raise _compile.ConfigurationError(
            f"attention block_sizes (Br={br}, Bc={bc}, warps={warps}), head_dim {d}, {dt}: needs {smem} bytes of shared memory, "
            f"the device allows {_compile.max_shared_optin(dev)}")
    out = cupy.empty((B, Hq, Sq, d), dtype=dt)
    lse = cupy.empty((B, Hq, Sq), dtype=np.float32)
    if B == 0 or Hq == 0 or Sq == 0:
        return out[..., :p.head_dim], lse
    if d != p.head_dim:
        qq, kk, vv = (pad_head_dim(a, d) for a in (p.q, p.k, p.v))
    else:
        qq, kk, vv = (last_axis_contiguous(a) for a in (p.q, p.k, p.v))
    it = np.dtype(dt).itemsize

    def st(a):
        s = a.strides
        return [np.int64(s[0] // it), np.int64(s[1] // it), np.int64(s[2] // it)]

    left, right = p.window
    args = [qq, kk, vv, out, lse, *st(qq), *st(kk), *st(vv), *st(out),
            np.int32(Hq), np.int32(p.group), np.int32(Sq), np.int32(Sk),
            np.float32(p.softmax_scale * LOG2E), np.int32(left), np.int32(right)]
    kern = _compile.get_kernel(SOURCE, name)
    if dt == _dtypes.float32:
        grid = (math.ceil(Sq / F32_WARPS), Hq, B)
        block = (F32_WARPS * 32,)
    else:
        grid = (math.ceil(Sq / br), Hq, B)
        block = (warps * 32,)
    _compile.launch(kern, grid, block, tuple(args), shared_mem=smem,
                    what=lambda: f"attention fa2 (Br={br}, Bc={bc}, warps={warps}, head_dim={d}, {dt})")
    if d != p.head_dim:
        out = cupy.ascontiguousarray(out[..., :p.head_dim])
    return out, lse
