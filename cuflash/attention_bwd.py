"""Attention backward with recomputation: dQ, dK, dV from the forward's saved logsumexp.

FlashAttention-2 (Dao 2023, arXiv:2307.08691, Algorithm 2; Dao et al. 2022, FlashAttention, Alg. 4 and App. B.2).
The (seqlen_q, seqlen_k) matrices are never stored: with ``lse`` from the forward, ``P = exp(S - lse)`` is exact
(not an online estimate), so the backward recomputes ``S = Q Kᵀ·scale`` tile by tile and needs only
``D = rowsum(dO ∘ O)`` (the row term of the softmax Jacobian, eq. ``dS = P ∘ (dP − D)``):

    dV = Pᵀ dO          dP = dO Vᵀ          dS = P ∘ (dP − D)          dQ = dS K · scale      dK = dSᵀ Q · scale

Kernels (``cuda_src/attention_bwd.cu``): a preprocess pass (D in float32, the lse with -inf made safe, the dQ
accumulator zeroed); the main pass parallel over K/V tiles (grid ``(ceil(Sk/64), heads_kv, batch)``; each block
loops over the query heads of its GQA group and the Q tiles that see its keys, keeping dK, dV in float32
registers); dQ either by float32 ``atomicAdd`` into a workspace (default, ``deterministic=False``: the summation
order over K tiles varies between runs, so dQ may differ in the last bits) or, with ``deterministic=True``, by a
separate kernel parallel over Q tiles that recomputes S, P, dP per K tile and sums in a fixed order (bitwise
reproducible; about 40 % more FLOPs). float16 / bfloat16 run on tensor cores (mma.sync m16n8k16, float32
accumulators; P and dS are rounded to the input dtype before the products, as in FlashAttention); float32 runs
a SIMT path (exact float32 arithmetic, one warp per row, deterministic either way, slow).

Traffic of the tensor-core path per (batch, head): K, V read once; Q, dO read once per K tile
(2·ceil(Sk/64)·Sq·d elements); dK, dV written once; dQ: Sq·d float32 atomics per K tile (default) or Q, dO,
K, V re-read by the dQ kernel (deterministic).

Using it from PyTorch without copies: ``experiments/torch_autograd_example.py`` (shown in README's API tour) wraps
the forward and this backward in a ``torch.autograd.Function`` through DLPack views both ways (bfloat16 crosses as a
16-bit integer view, which every DLPack version carries; the kernels run on torch's current stream), with
``causal``, ``softmax_scale`` and ``window_size``, and checks itself against torch SDPA in float64.
"""
from __future__ import annotations

import math

import numpy as np

from . import _compile, _dtypes
from ._attn_common import (NATIVE_HEAD_DIMS, as_bool, as_cupy, check_grid_yz, head_dim_text, last_axis_contiguous,
                           pad_head_dim, parse_block_sizes, prepare)

SOURCE = "attention_bwd.cu"
BM = 64           # Br: query rows per Q tile of the tensor-core kernels
# Bc (keys per block of the dK/dV kernel) per padded head_dim. 64: 4 warps (8 for head_dim 256); 128: 8 warps
# (half the dQ atomics and Q/dO tile loads per FLOP, fewer resident blocks). EXTRA_BC: also instantiated, selectable
# with block_sizes=(64, Bc) (the benchmark times both).
DEFAULT_BC = {32: 64, 64: 64, 96: 64, 128: 128, 256: 64}  # 128 at head_dim 128: ~10 % faster on the H200
EXTRA_BC = {64: (128,), 128: (64,)}
ROWS_WARPS = 8  # preprocess / convert: 8 warps a block, a row every `tpr` lanes (_row_split)
SM90_SOURCE = "attention_bwd_sm90.cu"
SM90_OPTIONS = ("--gpu-architecture=sm_90a",)
SM90_DKDV = True  # compute capability 9.0, float16/bfloat16, padded head_dim 64 or 128, no block_sizes: the dK/dV
                  # pass (and the atomic dQ) by warpgroup MMA (bwd_dkdv_sm90, Bc = 128, two warpgroups); False: the
                  # mma.sync kernel everywhere (as on sm_80, or with block_sizes given)
SM90_HEAD_DIMS = (64, 128)
SM90_STAGES = 1   # Q / dO / lse / Delta buffers of bwd_dkdv_sm90; 2 (study setting): the tile after next is loaded
                  # while this one is used -- 1-4 % slower on the H200 (logs/bwd_next_st2_0b7d0ea.json)
SM90_STAGE_CHOICES = (1, 2)
SM90_DQ_BULK = True  # the wgmma kernel adds dQ tiles by bulk reductions of the copy engine (one per warpgroup and Q
                     # tile, from shared memory); False: float2 atomicAdd from registers, as the mma.sync kernel
SM90_LSE_ASYNC = False  # with one buffer, lse and Delta by plain loads of the first 64 threads (compiled with
                        # -DCUFLASH_BWD_LSE_ASYNC=0); True (study): by cp.async with Q and dO -- 0.6-2 % slower on
                        # the H200 at both head_dims (logs/bwd_ab_*_e364c1a.json)
SM90_DQ_FIXED = True  # a kernel compiled for the call's dQ mode alone (-DCUFLASH_BWD_DQ_MODE=m: no run-time
                      # dq_mode branches); False (study): one kernel for all modes, which branches at run time --
                      # 2-5 % slower at head_dim 64 and 1-1.5 % at 128 (logs/bwd_vs_tree_*_db02a85.json). The
                      # other study settings (SM90_STAGES = 2, SM90_OVERLAP, SM90_LSE_ASYNC) always run that one
SM90_OVERLAP = False  # study: P^T computed while dP^T's wgmma runs and dS^T while dV's does (else both wait);
                      # within +-1 % of the default on the H200 (logs/bwd_next_ovl1_0b7d0ea.json)


def sm90_smem(head_dim: int, stages: int = 1, bulk_dq: bool = True) -> int:
    """Dynamic shared memory of bwd_dkdv_sm90: 1024-byte alignment, K, V (128 rows), ``stages`` x (Q, dO (64 rows)),
    dS^T, ``stages`` x (lse, D), and with ``bulk_dq`` the dQ staging of the bulk reductions (64 rows x head_dim
    float32)."""
    return (1024 + 2 * 128 * head_dim * 2 + stages * 2 * 64 * head_dim * 2 + 128 * 64 * 2 + stages * 2 * 64 * 4
            + (64 * head_dim * 4 if bulk_dq else 0))


SM90_LSE_SYNC_OPTIONS = SM90_OPTIONS + ("-DCUFLASH_BWD_LSE_ASYNC=0",)


def sm90_options(stages: int = 1, lse_async: bool | None = None, dq_mode: int | None = None) -> tuple[str, ...]:
    """The NVRTC options of bwd_dkdv_sm90 with ``stages`` buffers under ``lse_async`` (default: the SM90_LSE_ASYNC
    setting; two buffers load lse by cp.async whatever the macro says, and compile with the plain options); with
    ``dq_mode`` (0 none, 1 atomics, 2 bulk) the kernel compiled for that mode alone (SM90_DQ_FIXED)."""
    lse_async = SM90_LSE_ASYNC if lse_async is None else lse_async
    opts = SM90_OPTIONS if (stages == 2 or lse_async) else SM90_LSE_SYNC_OPTIONS
    return opts if dq_mode is None else opts + (f"-DCUFLASH_BWD_DQ_MODE={int(dq_mode)}",)
SIMT_ROWS = 4     # float32 SIMT kernels: one warp per row, 4 rows per block


def warps_n(head_dim: int) -> int:
    """Warps sharing a 16-row strip (each owns head_dim / WN columns of dK, dV, dQ): 2 for head_dim 256."""
    return 2 if head_dim > 128 else 1


def kernel_names(dtype, head_dim: int, bc: int | None = None) -> dict:
    """C++ name expressions of the kernels one call launches for (dtype, padded head_dim, Bc)."""
    dt = np.dtype(dtype)
    ct = _dtypes.ctype(dt)
    ns = "cuflash::attn_bwd::"
    names = {"preprocess": f"{ns}bwd_preprocess<{ct}>"}
    if dt == _dtypes.float32:
        names.update(dq=f"{ns}bwd_dq_simt<float>", dkdv=f"{ns}bwd_dkdv_simt<float>")
    else:
        wn = warps_n(head_dim)
        bc = DEFAULT_BC[head_dim] if bc is None else bc
        names.update(dkdv=f"{ns}bwd_dkdv<{ct}, {head_dim}, {wn}, {bc}>", dq=f"{ns}bwd_dq<{ct}, {head_dim}, {wn}>",
                     convert=f"{ns}bwd_dq_convert<{ct}>")
    return names


def sm90_name(dtype, head_dim: int, stages: int = 1, overlap: bool = False) -> str:
    """The wgmma dK/dV kernel for a 16-bit dtype, a padded head_dim of SM90_HEAD_DIMS, its Q/dO buffers and
    whether the softmax steps overlap the wgmmas (SM90_OVERLAP)."""
    return (f"cuflash::attn_bwd::bwd_dkdv_sm90<{_dtypes.ctype(np.dtype(dtype))}, {head_dim}, {stages}, "
            f"{'true' if overlap else 'false'}>")


def uses_sm90_dkdv(dtype, head_dim_padded: int, device: int, block_sizes=None) -> bool:
    """Whether attention_backward runs the wgmma dK/dV kernel (bwd_dkdv_sm90) for these arguments."""
    return (SM90_DKDV and np.dtype(dtype) in (_dtypes.float16, _dtypes.bfloat16) and block_sizes is None
            and head_dim_padded in SM90_HEAD_DIMS and _compile.compute_capability(device) == 90)


def smem_bytes(dtype, head_dim: int, kernel: str, bc: int | None = None) -> int:
    """Dynamic shared memory of the tensor-core kernels (rows padded by 8 elements)."""
    it = np.dtype(dtype).itemsize
    ld = head_dim + 8
    bc = DEFAULT_BC[head_dim] if bc is None else bc
    if kernel == "dkdv":   # K, V tiles (Bc rows), Q, dO tiles (Br rows), dS^T tile, lse and D of the Q tile
        return (2 * bc * ld + 2 * BM * ld + bc * (BM + 8)) * it + 2 * BM * 4
    if kernel == "dq":     # Q, dO, K, V tiles, lse and D
        return 4 * BM * ld * it + 2 * BM * 4
    return 0


def _declare():
    _compile.declare(SOURCE, [kernel_names(_dtypes.float32, 32)[k] for k in ("preprocess", "dq", "dkdv")])
    for dt in (_dtypes.float16, _dtypes.bfloat16):
        for d in NATIVE_HEAD_DIMS:
            _compile.declare(SOURCE, list(kernel_names(dt, d).values()))
            for bc in EXTRA_BC.get(d, ()):
                _compile.declare(SOURCE, [kernel_names(dt, d, bc)["dkdv"]])
    dts = (_dtypes.float16, _dtypes.bfloat16)
    # release: one kernel per dQ mode that the defaults reach (0 deterministic, 2 bulk; 1, atomics, is the
    # SM90_DQ_BULK = False study)
    for m in (0, 1, 2):
        _compile.declare(SM90_SOURCE, [sm90_name(dt, d) for dt in dts for d in SM90_HEAD_DIMS],
                         extra_options=sm90_options(1, False, m), release=m != 1)
    # study settings: SM90_DQ_FIXED = False (dq_mode a run-time argument), SM90_OVERLAP; SM90_LSE_ASYNC (one
    # buffer); SM90_STAGES = 2 (lse by cp.async there always)
    _compile.declare(SM90_SOURCE, [sm90_name(dt, d) for dt in dts for d in SM90_HEAD_DIMS],
                     extra_options=sm90_options(1, False), release=False)
    _compile.declare(SM90_SOURCE, [sm90_name(dt, d, 1, True) for dt in dts for d in SM90_HEAD_DIMS],
                     extra_options=sm90_options(1, False), release=False)
    _compile.declare(SM90_SOURCE, [sm90_name(dt, d, st, ov) for dt in dts for d in SM90_HEAD_DIMS
                                   for st in SM90_STAGE_CHOICES for ov in (False, True)],
                     extra_options=SM90_OPTIONS, release=False)


_declare()


def all_kernel_names() -> list[str]:
    """Every name expression this module can launch (the declared set)."""
    return [n for src, n, _, _ in _compile.declared() if src == SOURCE]


def _compile_one(args):
    name, device = args
    import cupy

    with cupy.cuda.Device(device):
        _compile.get_kernel(SOURCE, name)
    return name


def precompile(names=None, workers=None) -> int:
    """Compile backward kernels for the current device in parallel processes (fills CuPy's on-disk cache).

    A cold start otherwise compiles each instantiation serially on first use (seconds each). Returns the number
    compiled; errors in a worker are raised here. ``names`` defaults to :func:`all_kernel_names`.
    """
    import concurrent.futures as cf
    import multiprocessing as mp
    import os

    import cupy

    names = list(all_kernel_names() if names is None else names)
    if not names:
        return 0
    dev = cupy.cuda.runtime.getDevice()
    n = workers or max(1, min(len(names), (os.cpu_count() or 2) - 1))
    with cf.ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
        done = list(ex.map(_compile_one, [(x, dev) for x in names]))
    return len(done)


def flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal=False) -> float:
    """Backward FLOPs by the FlashAttention convention: 2.5 x the forward's 4·B·H·Sq·Sk·d (halved when causal)."""
    f = 2.5 * 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return f / 2 if causal else f


def _empty_like_layout(a, shape, dtype):
    """An uninitialised array of ``shape`` whose memory order follows ``a``'s strides (last axis contiguous).

    A (batch, seqlen, heads, head_dim) tensor viewed as (batch, heads, seqlen, head_dim) gets a gradient of the
    same kind of view; anything else gets a C-contiguous array.
    """
    import cupy

    st = a.strides
    order = sorted(range(a.ndim), key=lambda i: (-abs(st[i]), i))
    if order[-1] != a.ndim - 1:
        return cupy.empty(shape, dtype=dtype)
    buf = cupy.empty(tuple(shape[i] for i in order), dtype=dtype)
    inv = [order.index(i) for i in range(a.ndim)]
    return buf.transpose(inv)


def _bits(a):
    """A 16-bit array as uint16 (copies and padding then never depend on CuPy's bfloat16 kernels)."""
    import cupy

    return a.view(cupy.uint16) if a.itemsize == 2 else a


def _contig(a):
    """``a`` when its last axis is unit-stride and rows are 16-byte aligned, else a C-contiguous copy."""
    if a.itemsize == 2:
        return last_axis_contiguous(_bits(a)).view(a.dtype)
    return last_axis_contiguous(a)


def _pad(a, d_to):
    """Zero-pad the last axis of ``a`` to ``d_to`` (through a uint16 view for 16-bit dtypes)."""
    return pad_head_dim(_bits(a), d_to).view(a.dtype) if a.itemsize == 2 else pad_head_dim(a, d_to)


def _row_split(D: int, per: int, B: int, Hq: int, Sq: int):
    """Lanes per row (``tpr``: the power of two <= 32 covering D columns ``per`` at a time) and the grid
    (ceil(Sq / rows per block), Hq, B) of the preprocess / convert kernels (ROWS_WARPS warps, 32 / tpr rows each)."""
    tpr = min(32, 1 << max(0, math.ceil(D / per) - 1).bit_length())
    return tpr, (math.ceil(Sq / (ROWS_WARPS * (32 // tpr))), Hq, B)


def _aligned(arrays, D: int, nbytes: int) -> bool:
    """Whether every row of each (B, H, S, D) array (last axis contiguous) starts ``nbytes``-aligned and D
    elements are whole ``nbytes`` pieces: the preprocess / convert kernels then move ``nbytes`` per access."""
    return all((D * a.itemsize) % nbytes == 0 and a.data.ptr % nbytes == 0
               and all(s % nbytes == 0 for s in a.strides[:-1]) for a in arrays)


def _st(a):
    it = a.itemsize
    s = a.strides
    return [np.int64(s[0] // it), np.int64(s[1] // it), np.int64(s[2] // it)]


def attention_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                       deterministic=False, block_sizes=None):
    """Gradients of ``out = attention(q, k, v)`` with respect to q, k, v, recomputing P from ``lse``.

    The backward of FlashAttention-2 (Dao 2023, Algorithm 2; the recomputation and ``D = rowsum(dO ∘ O)`` of
    Dao et al. 2022, Algorithm 4 and Appendix B.2). On Hopper (compute capability 9.0), float16 / bfloat16 with a
    padded head_dim of 64 or 128 and no ``block_sizes``, the dK/dV pass runs on warpgroup MMA (wgmma; the mapping
    after FlashAttention-3, Shah et al. 2024, Sec. 3): Br = 64, Bc = 128, two warpgroups of 64 keys.

    Parameters
    ----------
    dout : (batch, heads_q, seqlen_q, head_dim), the gradient of ``out``; q's dtype, any strides.
    q : (batch, heads_q, seqlen_q, head_dim); k, v : (batch, heads_kv, seqlen_k, head_dim); float16, bfloat16 or
        float32, any strides; heads_q % heads_kv == 0 (GQA / MQA).
    out : (batch, heads_q, seqlen_q, head_dim), the forward's output (q's dtype).
    lse : (batch, heads_q, seqlen_q) float32 (float64 / float16 / bfloat16 are converted), the forward's natural-log
        logsumexp of the scaled, masked scores; -inf for a row that sees no key (its gradients are 0 when k and
        v are finite: a NaN or inf in a row of k or v reaches dq of every query row sharing that key's tile, masked
        or not, through dS = 0 times K and dP = dO·Vᵀ, as NaN in v reaches out in the forward; FlashAttention's
        kernels do the same).
    causal, softmax_scale, window_size : exactly as given to the forward (bottom-right aligned mask; the scale
        defaults to 1/sqrt(head_dim)).
    deterministic : False (default): dQ is summed over K tiles with float32 atomicAdd, whose order varies, so
        dq may differ in the last bits between runs (dk, dv never do). True: a separate dQ kernel sums in a
        fixed order; results are bitwise identical over repeated runs. float32 inputs are always deterministic.
    block_sizes : (Br, Bc) of the mma.sync dK/dV kernel (float16 / bfloat16), chosen instead of the default
        (the wgmma kernel on Hopper at head_dim 64 / 128; elsewhere (64, 128) at head_dim 128, (64, 64)
        otherwise); also instantiated: (64, 128) at head_dim 64 and (64, 64) at 128.
        Anything else raises ValueError (also for float32, which then ignores a valid pair).

    Returns
    -------
    (dq, dk, dv) : CuPy arrays with the shapes and dtypes of q, k, v; each follows its input's memory order
    (a (batch, seqlen, heads, head_dim) view gets a gradient of the same kind), else C-contiguous. dk and dv
    are summed over the query heads of each GQA group.

    Raises
    ------
    TypeError : non-arrays (host arrays included); unsupported, mixed or mismatched dtypes (dout / out must have
        q's dtype; lse a floating dtype); a non-bool ``causal`` or ``deterministic``; the ``softmax_scale`` and
        ``window_size`` cases of :func:`cuflash.attention`.
    ValueError : the q / k / v, ``softmax_scale`` and ``window_size`` cases of :func:`cuflash.attention`
        (ranks, shapes, sizes, head_dim outside 1..256, heads, devices, scale not finite in float32, window not
        a pair or < -1); more than 65535 batches or query heads (a grid dimension), before any allocation;
        dout / out not of q's shape or lse not of shape (batch, heads_q, seqlen_q); dout, out or lse on
        another device than q; block_sizes malformed (also for float32) or not instantiated;
        ``ConfigurationError`` (a ValueError) when shared memory does not fit the device.
    """
    import cupy

    dout = as_cupy(dout, "dout")  # arguments are checked in signature order
    p = prepare(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size)
    check_grid_yz(p)
    out, lse = as_cupy(out, "out"), as_cupy(lse, "lse")
    B, Hq, Hkv, Sq, Sk, D = p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim
    dt = p.dtype
    for name, a in (("dout", dout), ("out", out)):
        if a.dtype != dt:
            raise TypeError(f"{name} must have q's dtype {dt}, got {a.dtype}")
        if a.shape != p.q.shape:
            raise ValueError(f"{name} must have q's shape {p.q.shape}, got {a.shape}")
    if lse.dtype.kind != "f" and lse.dtype != _dtypes.bfloat16:
        raise TypeError(f"lse must be a floating array (float32), got {lse.dtype}")
    if lse.shape != (B, Hq, Sq):
        raise ValueError(f"lse must have shape (batch, heads_q, seqlen_q) = {(B, Hq, Sq)}, got {lse.shape}")
    dev = p.q.device.id
    for name, a in (("dout", dout), ("out", out), ("lse", lse)):
        if a.device.id != dev:
            raise ValueError(f"{name} is on device {a.device.id}, q on device {dev}")

    d = p.head_dim_padded
    f32 = dt == _dtypes.float32
    deterministic = as_bool(deterministic, "deterministic")
    bc = DEFAULT_BC.get(d, 64)
    if block_sizes is not None:  # checked on every path; float32 (the SIMT kernel) then ignores a valid pair
        br, bc_req = parse_block_sizes(block_sizes)
        avail = [(BM, DEFAULT_BC[d])] + [(BM, c) for c in EXTRA_BC.get(d, ())]
        if (br, bc_req) not in avail:
            raise ValueError(f"block_sizes {block_sizes!r} is not instantiated for {head_dim_text(D, d)}, {dt}; "
                             f"available: {avail}")
        if not f32:
            bc = bc_req

    dq = _empty_like_layout(p.q, p.q.shape, dt)
    dk = _empty_like_layout(p.k, p.k.shape, dt)
    dv = _empty_like_layout(p.v, p.v.shape, dt)
    if B == 0 or Hq == 0 or Sq == 0 or Sk == 0 or D == 0:
        for a in (dq, dk, dv):
            _bits(a).fill(0)
        return dq, dk, dv

    if lse.dtype != np.float32:
        lse = lse.astype(np.float32)
    left, right = p.window  # (a bound >= seqlen_q + seqlen_k is already -1: prepare)
    scale = np.float32(p.softmax_scale)
    names = kernel_names(dt, d, None if f32 else bc)

    rows = B * Hq * Sq
    delta = cupy.empty(rows, dtype=np.float32)
    lse_safe = cupy.empty(rows, dtype=np.float32)
    use_atomic = (not f32) and (not deterministic)
    dq_accum = cupy.empty(rows * d if use_atomic else 1, dtype=np.float32)

    out_c = out if out.strides[-1] == out.itemsize else _contig(out)
    do_c = dout if dout.strides[-1] == dout.itemsize else _contig(dout)
    lse_st = [np.int64(s // 4) for s in lse.strides]
    tpr, grid = _row_split(D, 16 // dt.itemsize, B, Hq, Sq)
    _compile.launch(_compile.get_kernel(SOURCE, names["preprocess"]), grid, (32 * ROWS_WARPS,),
                    (out_c, do_c, lse, delta, lse_safe, dq_accum, *_st(out_c), *_st(do_c), *lse_st,
                     np.int32(Hq), np.int32(Sq), np.int32(D), np.int32(d), np.int32(use_atomic), np.int32(tpr),
                     np.int32(_aligned((out_c, do_c), D, 16))), what="attention_backward preprocess")

    common = (np.int32(Hq), np.int32(Hkv), np.int32(Sq), np.int32(Sk), np.int32(D), np.int32(left),
              np.int32(right), scale)
    if f32:
        qq, kk, vv, gg = (a if a.strides[-1] == a.itemsize else _contig(a) for a in (p.q, p.k, p.v, do_c))
        _compile.launch(_compile.get_kernel(SOURCE, names["dkdv"]), (math.ceil(Sk / SIMT_ROWS), Hkv, B),
                        (32 * SIMT_ROWS,),
                        (qq, kk, vv, gg, lse_safe, delta, dk, dv, *_st(qq), *_st(kk), *_st(vv), *_st(gg),
                         *_st(dk), *_st(dv), *common), what="attention_backward dK/dV (float32 SIMT)")
        _compile.launch(_compile.get_kernel(SOURCE, names["dq"]), (math.ceil(Sq / SIMT_ROWS), Hq, B),
                        (32 * SIMT_ROWS,),
                        (qq, kk, vv, gg, lse_safe, delta, dq, *_st(qq), *_st(kk), *_st(vv), *_st(gg),
                         *_st(dq), *common), what="attention_backward dQ (float32 SIMT)")
        return dq, dk, dv

    if d != D:
        qq, kk, vv, gg = (_pad(a, d) for a in (p.q, p.k, p.v, do_c))
    else:
        qq, kk, vv, gg = (_contig(a) for a in (p.q, p.k, p.v, do_c))
    wn = warps_n(d)
    block = (128 * wn,)
    sm90 = uses_sm90_dkdv(dt, d, dev, block_sizes)
    # dQ accumulation: 0 none (deterministic: a dQ kernel), 1 atomicAdd into rows of d floats, 2 (wgmma kernel,
    # SM90_DQ_BULK) bulk reductions into two planes of d / 2 columns per (batch, head)
    dq_mode = 0 if not use_atomic else 2 if (sm90 and SM90_DQ_BULK) else 1
    dkdv_args = (qq, kk, vv, gg, lse_safe, delta, dq_accum, dk, dv, *_st(qq), *_st(kk), *_st(vv), *_st(gg),
                 *_st(dk), *_st(dv), *common, np.int32(dq_mode))
    if sm90:
        if SM90_STAGES not in SM90_STAGE_CHOICES:
            raise ValueError(f"attention_bwd.SM90_STAGES must be one of {SM90_STAGE_CHOICES}, got {SM90_STAGES!r}")
        # the study settings run the kernel with run-time dq_mode branches, as they were measured
        fixed = SM90_DQ_FIXED and SM90_STAGES == 1 and not SM90_OVERLAP and not SM90_LSE_ASYNC
        _compile.launch(_compile.get_kernel(SM90_SOURCE, sm90_name(dt, d, SM90_STAGES, bool(SM90_OVERLAP)),
                                            sm90_options(SM90_STAGES, None, dq_mode if fixed else None)),
                        (math.ceil(Sk / 128), Hkv, B), (256,), dkdv_args,
                        shared_mem=sm90_smem(d, SM90_STAGES, dq_mode == 2),
                        what=lambda: f"attention_backward dK/dV (wgmma, head_dim {d}, {dt})")
    else:
        _compile.launch(_compile.get_kernel(SOURCE, names["dkdv"]), (math.ceil(Sk / bc), Hkv, B),
                        (32 * (bc // 16) * wn,), dkdv_args, shared_mem=smem_bytes(dt, d, "dkdv", bc),
                        what=lambda: f"attention_backward dK/dV (head_dim {d}, Bc {bc}, {dt})")
    if use_atomic:
        tpr, grid = _row_split(D, 4, B, Hq, Sq)
        _compile.launch(_compile.get_kernel(SOURCE, names["convert"]), grid, (32 * ROWS_WARPS,),
                        (dq_accum, dq, *_st(dq), np.int32(Hq), np.int32(Sq), np.int32(D), np.int32(d), scale,
                         np.int32(2 if dq_mode == 2 else 1), np.int32(tpr), np.int32(_aligned((dq,), D, 8))),
                        what="attention_backward dQ convert")
    else:
        _compile.launch(_compile.get_kernel(SOURCE, names["dq"]), (math.ceil(Sq / BM), Hq, B), block,
                        (qq, kk, vv, gg, lse_safe, delta, dq, *_st(qq), *_st(kk), *_st(vv), *_st(gg), *_st(dq),
                         *common), shared_mem=smem_bytes(dt, d, "dq"),
                        what=lambda: f"attention_backward dQ deterministic (head_dim {d}, {dt})")
    return dq, dk, dv
