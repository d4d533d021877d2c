"""Softmax, log_softmax and logsumexp with ``scipy.special``'s signatures and values, and the online-softmax
state ``(m, l)`` they are built on (Milakov & Gimelshein, 2018).

What this file teaches: a softmax is a reduction of each row to the state ``m = max(x)``, ``l = sum(exp(x - m))``
followed (for softmax/log_softmax) by an elementwise pass. States merge: ``m = max(ma, mb)``,
``l = la·exp(ma − m) + lb·exp(mb − m)``, so one row can be cut over threads, warps, blocks, devices or time.
The kernels (``cuda_src/softmax.cu``) pick one shape per call (slots = 16-byte vectors per row, NV = 8 per
thread, 4 for float64):

==============  ==========================================================  =============================
path            when                                                        HBM traffic (softmax)
==============  ==========================================================  =============================
``warp``        slots <= 32·NV: G = 1..32 lanes per row, row in registers   read n, write n
``block``       slots <= 512·NV (512·2NV for 16/32-bit), rows >= SMs:       read n, write n
                a block per row, row in registers
``split``       longer rows, or fewer rows than SMs (not float64): chunks   read n (+ n from L2), write n
                of 32-64 KiB; a block reduces one chunk and publishes its
                state, then normalises the chunk D tickets back once its
                row's states are in (one launch, no length limit)
``split_regs``  study only (``partition={"split": "registers"}``): chunks   read n, write n
                held in registers while the row's blocks wait for each
                other; K bounded by the blocks that fit on the GPU
``cluster``     cc >= 9.0, rows of ``CLUSTER_ROW_BYTES``, rows x C >= SMs   read n, write n (+ from L2
                (not float64): a row over a thread-block cluster of C = 1,  the part of rows longer than
                2, 4, 8 or 16 blocks, each holding its segment in shared    C x 64 KiB)
                memory (bulk copies or cp.async: ``CLUSTER_BULK_SIZES``);
                the C states merge through distributed shared memory
                (st.async + mbarrier; one launch)
``held``        cc 9.0, rows of ``HELD_ROW_BYTES`` (2 MiB) up to about 8 MiB  read n, write n
                (K <= resident blocks + 1 chunks; not float64): chunks of
                32 KiB held in shared memory by a cooperative persistent
                grid, each written once its row's states are published
``stream``      lse/state of long rows, float64 long rows, the ``safe`` and  read 2n, write n (lse: n)
                ``naive`` methods: partial states, then a second launch
==============  ==========================================================  =============================

``partition`` below is a study knob of the internal entry points (``_softmax_impl``, ``_reduce_impl``; the
experiment scripts use it), not an argument of the public functions.
The ``held`` path (softmax/log_softmax only) is forced by ``partition={"path": "held"}`` (``config``: one of
``HELD_CONFIGS``) and left out by ``partition={"held": 0}``.
The ``cluster`` path is chosen automatically for softmax/log_softmax only (lse and the state take it when
forced): ``partition={"path": "cluster", "cluster": C}`` forces it (C optional); ``partition={"cluster": 0}``
or ``CLUSTER_ROW_BYTES = None`` leave the planner as it was without it (``block``/``split`` for long rows);
``partition={"copy": "bulk"}`` or ``{"copy": "cp.async"}`` picks how its blocks copy their segments.

``method="online"`` (default) takes the cheapest path; ``"safe"`` makes three passes (max, sum, normalise);
``"naive"`` sums exp(x) with no max subtraction (overflows by design: the overflow experiment).
Accumulation is float32 (float64 for float64 input); states are float32 (float64 for float64 input).
Edge values follow scipy.special (an all −inf row: softmax NaN, logsumexp −inf; +inf entries: softmax NaN,
logsumexp +inf; NaN propagates; logsumexp over an empty axis: −inf; softmax over an empty axis: ValueError).
Deviations, deliberately: bfloat16 input gives bfloat16 logsumexp (scipy's promotion returns float64), and
logsumexp over an empty array with ``axis=None`` returns −inf (scipy raises IndexError for ndim >= 2).
"""
from __future__ import annotations

import math
import operator
from collections import namedtuple

import numpy as np

from . import _compile, _dtypes
from ._attn_common import aligned_contiguous as _contiguous, as_bool, as_cupy

SOURCE = "softmax.cu"
OP_SOFTMAX, OP_LOG_SOFTMAX, OP_LSE, OP_STATE = 0, 1, 2, 3
MODE_ONLINE, MODE_MAX, MODE_SUMEXP, MODE_NAIVE = 0, 1, 2, 3
METHODS = ("online", "safe", "naive")

NV = 8                                  # 16-byte slots per thread in the cached kernel (4 for float64)
WARP_THREADS = 256                      # block size of the warp path (256 / G rows per block)
WARP_GROUPS = (1, 2, 4, 8, 16, 32)      # lanes per row on the warp path
BLOCK_THREADS = (64, 128, 256, 512)  # 1024 threads would cap registers at 64 and spill
SPLIT_THREADS, SPLIT_UNROLL = 256, 8    # the pipelined split (version 3): 256 threads, 8 slots in flight each
SPLIT_CHUNK_SLOTS = 2048                # its chunks: 2048 slots = 32 KiB (16-bit types: 4096 = 64 KiB)
SPLIT_MIN_SLOTS = 256                   # chunks of rows split for parallelism are at least 4 KiB
SPLIT_MAX_THREADS = 512                 # register split ("split_regs"): <= 512 threads x 8 slots = 64 KiB
STREAM_THREADS, STREAM_UNROLL = (128, 512), 4  # streaming kernels: 4 slots in flight per thread per iteration
# the cluster split (compute capability >= 9.0; softmax_cluster in cuda_src/softmax.cu)
CLUSTER_ROW_BYTES = {2: ((64 << 10) + 2, 2 << 20),  # rows of this many bytes take it (softmax/log_softmax), by
                     4: (128 << 10, 2 << 20)}        # itemsize; None: never.
# On the H200 (experiments/results/logs/softmax_cluster_probe.txt) 128-512 KiB rows ran at 0.70-0.86 of copy on
# it against 0.58-0.81 on block/split; shorter rows are faster on the block path, longer ones on the split.
# 16-bit rows of 64 KiB stay on the block path (0.896 of copy; C = 1, a block per row with the row in shared
# memory, ran 0.895 with the merge-tree block reduction and 0.873-0.878 with block_state, which made C >= 2 3-9 %
# faster: experiments/results/sm_bs2_*.json; float32 64 KiB rows: C = 1 0.93 against 0.95 on the block path,
# experiments/results/softmax_probe_58889f9_*.json). C = 1 stays for study: partition={"path": "cluster", "cluster": 1}.
# 1 MiB rows: C = 16, the row held in shared memory, float32 0.788 and bfloat16 0.715 of copy against 0.743 /
# 0.697 at C = 8 (64 KiB of each 128 KiB segment held, the rest streamed); 2 MiB rows: C = 16 with 64 KiB of each
# 128 KiB segment held, 0.701 / 0.650 against 0.692 / 0.628 on the split; 4 MiB rows stay on the split (0.69
# against 0.54; experiments/results/softmax_c16_probe_*.json). Without C = 16 (compute capability other than
# 9.0) rows of more than 8 x CLUSTER_MAX_SEGMENT_BYTES stay on the split (experiments/results/
# softmax_hold_probe_734c46c_*.json: 2 MiB rows at C = 8 0.44-0.55 against 0.63-0.69).
CLUSTER_SIZES = (1, 2, 4, 8, 16)        # blocks per cluster (1: a block per row, no exchange; 16: non-portable)
CLUSTER_PORTABLE = 8                    # larger sizes: the function must allow them (_compile), and the automatic
CLUSTER_NON_PORTABLE_CC = (90,)         # plan takes them on these compute capabilities only (Hopper allows 16)
CLUSTER_THREADS = 256
CLUSTER_SEGMENT_BYTES = 64 << 10        # C: the smallest size whose segments are at most this (3 blocks/SM fit) ...
CLUSTER_HOLD_BYTES = 64 << 10           # ... a segment holds at most this in shared memory (3 blocks/SM), the rest
                                        # streams (and is re-read from L2); 96 KiB and more: 2 blocks, slower
CLUSTER_MAX_SEGMENT_BYTES = 128 << 10   # automatic plans: longer segments (half or more streamed) lose to the split
CLUSTER_MAX_CLUSTERS = 1 << 16          # clusters launched at most (one per row; more rows: cluster-stride)
# How a block copies the held part of its segment into shared memory: the sizes in CLUSTER_BULK_SIZES, when the
# segment is held whole, by bulk copies (cp.async.bulk: thread 0 issues four, completing on mbarriers), the
# others by cp.async (every thread its own 16-byte slots). Same-run map on the H200 at 128 KiB-2 MiB rows, every C
# with at most 128 KiB a block, three rounds (experiments/results/bulkmap_*_7445f0d.json): bulk / cp.async 1.08-1.10 at C = 8 (512 KiB rows:
# float32 0.839 -> 0.920 of copy), 1.03-1.07 at C = 16 (1 MiB rows), 1.01-1.02 at C = 2 (128 KiB rows), but
# 0.93-0.94 at C = 4 (256 KiB rows: float32 0.909 -> 0.848) and 0.98-1.01 on 2 MiB rows (half of each segment
# streamed); the same kernel otherwise, the same bits. The map covers the planner's C at each row length (and every
# C up to 128 KiB a block); C = 4 is cp.async at every length, though bulk lost only at 256 KiB rows (1.00-1.03x at
# 128 and 512 KiB, where the planner takes C = 2 and 8).
CLUSTER_BULK_SIZES = (2, 8, 16)
CLUSTER_COPIES = ("bulk", "cp.async")
CLUSTER_ARCH_OPTIONS = ("--gpu-architecture=sm_90",)  # cluster names compile for sm_90+ only (cuflash._compile)

# the held split (compute capability >= 9.0; softmax_hold in cuda_src/softmax.cu): rows cut into chunks of
# HELD_THREADS x spt slots, each copied once into shared memory and written from there once its row's states are
# published; a cooperative persistent grid (K <= resident blocks + 1). A configuration (spt, ahead, lag): slots a
# thread a chunk, chunks in flight ahead of the one reduced, iterations between a chunk's reduction and its output
# (ahead + 1 + lag buffers of 16·HELD_THREADS·spt bytes a block). On the H200, same-run A/B against the planner
# without it (experiments/results/logs/softmax_held_probe_*.json, 2-3 rounds, best round): (8, 1, 1), 32 KiB chunks
# and two blocks an SM, 4 MiB float32 rows 0.749 against 0.689 (split), 2 MiB float32 rows 0.757 against 0.725
# (C = 16), 16-bit 2 MiB rows 0.710 against 0.677; shorter rows lose (1 MiB: 0.71-0.77 against 0.79-0.83 at C = 16).
# Smaller chunks with more blocks, more chunks in flight or a longer lag ran slower (0.40-0.68): a block's
# iteration is a chain of latencies (per-phase cycles in softmax_held_stats_ec22630.json: ~1.5 us reducing,
# 1.0-2.8 us waiting for the row's states, 1.1 us writing) that two blocks an SM overlap best.
HELD_THREADS = 256
HELD_CONFIGS = ((8, 1, 1), (4, 1, 1), (6, 1, 2))
HELD_CONFIG = (8, 1, 1)                 # the automatic plan's
HELD_ROW_BYTES = 2 << 20                # rows of at least this many bytes take it automatically (None: never) ...
HELD_CC = (90,)                         # ... on these compute capabilities (measured on the H200)
HELD_SMEM_PER_SM = 228 << 10            # the planner's estimate of the resident blocks (the launch asks the driver)

_SUPPORTED = (_dtypes.float16, _dtypes.bfloat16, _dtypes.float32, _dtypes.float64)

Plan = namedtuple("Plan", "path threads group chunks slots_per_chunk copy", defaults=(None,))
Plan.__doc__ = """How one call runs: path (warp/block/split/cluster/held/stream), block size, lanes per row, chunks
per row (K; the cluster path: C, its blocks per row), 16-byte slots per chunk (S; the cluster path: per block) and,
on the cluster path, how a block copies its segment into shared memory ("bulk" or "cp.async"); on the held path its
configuration (spt, ahead, lag); else None."""


def _nv(dtype):
    return 4 if np.dtype(dtype).itemsize == 8 else NV


def _cached_name(ct, group, threads, nv=None):
    return f"cuflash::softmax_cached<{ct}, {group}, {threads}, {nv or (4 if ct == 'double' else NV)}>"


def _split_name(ct):
    return f"cuflash::softmax_split<{ct}, {SPLIT_THREADS}, {SPLIT_UNROLL}>"


def _stream_names(ct, threads):
    return (f"cuflash::softmax_partial<{ct}, {threads}, {STREAM_UNROLL}>",
            f"cuflash::softmax_normalise<{ct}, {threads}, {STREAM_UNROLL}>",
            f"cuflash::softmax_finalize<{ct}>")


def _cluster_name(ct, c, copy):
    return f"cuflash::softmax_cluster<{ct}, {CLUSTER_THREADS}, {c}, {'true' if copy == 'bulk' else 'false'}>"


def _held_name(ct, cfg):
    spt, ahead, lag = cfg
    return f"cuflash::softmax_hold<{ct}, {HELD_THREADS}, {spt}, {ahead}, {lag}>"


def _held_smem(cfg, slots=None):
    """Dynamic shared memory of a held block: ahead + 1 + lag buffers of ``slots`` (default: a whole chunk)."""
    spt, ahead, lag = cfg
    return (ahead + 1 + lag) * (slots or HELD_THREADS * spt) * 16


def _held_per_sm(cfg):
    """The planner's estimate of the held blocks an SM holds (shared memory, 1 KiB reserved a block; threads)."""
    return min(HELD_SMEM_PER_SM // (_held_smem(cfg) + 1024), 2048 // HELD_THREADS)


def _declare():
    for dt in _SUPPORTED:
        ct = _dtypes.CTYPE[dt]
        names = [_cached_name(ct, g, WARP_THREADS) for g in WARP_GROUPS]
        names += [_cached_name(ct, t, t) for t in BLOCK_THREADS]
        if dt != _dtypes.float64:  # the widest block: 512 threads x 16 slots (128 KiB of row in registers)
            names.append(_cached_name(ct, BLOCK_THREADS[-1], BLOCK_THREADS[-1], 2 * NV))
        for t in STREAM_THREADS:
            names += _stream_names(ct, t)
        if dt != _dtypes.float64:
            names.append(_split_name(ct))
        _compile.declare(SOURCE, list(dict.fromkeys(names)))
    _compile.declare(SOURCE, ["cuflash::softmax_merge_states<float>", "cuflash::softmax_merge_states<double>"])
    # sm_90+ only (the kernel is compiled out below sm_90): the compile check builds them for sm_90 alone
    _compile.declare(SOURCE, [_cluster_name(_dtypes.CTYPE[dt], c, cp) for dt in _SUPPORTED if dt != _dtypes.float64
                              for c in CLUSTER_SIZES for cp in CLUSTER_COPIES], extra_options=CLUSTER_ARCH_OPTIONS)
    _compile.declare(SOURCE, [_held_name(_dtypes.CTYPE[dt], cfg) for dt in _SUPPORTED if dt != _dtypes.float64
                              for cfg in HELD_CONFIGS], extra_options=CLUSTER_ARCH_OPTIONS)


_declare()


# ----------------------------------------------------------------------------------------------------------
# validation and layout (no device work, no allocation)
def _as_cupy(x, what="x"):
    """A CuPy view of ``x`` (the one conversion of every wrapper: cuflash._attn_common.as_cupy)."""
    return as_cupy(x, what)


def _check_dtype(dt, what="x"):
    dt = np.dtype(dt)
    if dt not in _SUPPORTED:
        raise TypeError(f"{what} has dtype {dt}; supported: float16, bfloat16, float32, float64")
    return dt


def _axes(axis, ndim):
    """Normalised tuple of reduced axes (sorted); ValueError (numpy's AxisError) when out of range."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, list):  # numpy and scipy take None, an int or a tuple
        raise TypeError(f"axis must be None, an int or a tuple of ints, got a list {axis!r}")
    if isinstance(axis, tuple):
        ax = [_one_axis(a, ndim) for a in axis]
        if len(set(ax)) != len(ax):
            raise ValueError(f"duplicate value in 'axis': {axis}")
        return tuple(sorted(ax))
    return (_one_axis(axis, ndim),)


_AxisError = getattr(getattr(np, "exceptions", np), "AxisError")  # a ValueError (and IndexError)


def _one_axis(a, ndim):
    try:
        if isinstance(a, (bool, np.bool_)):  # numpy and scipy refuse axis=True
            raise TypeError
        i = operator.index(a)
    except TypeError:
        raise TypeError(f"axis must be None, an int or a tuple of ints, got {a!r}") from None
    if not -ndim <= i < ndim:
        raise _AxisError(i, ndim)
    return i % ndim


# ----------------------------------------------------------------------------------------------------------
# planning
_OCC: dict = {}


def _pow2_at_least(v):
    return 1 << max(0, int(math.ceil(v)) - 1).bit_length()


def _residency(kernel, threads, smem=0):
    """Blocks of ``kernel`` that fit on the whole GPU at once (the driver's occupancy x SMs), with ``smem`` bytes of
    dynamic shared memory a block."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (id(kernel), threads, smem, dev)
    r = _OCC.get(key)
    if r is None:
        from cupy_backends.cuda.api import driver

        if smem:
            _compile.allow_dynamic_smem(kernel, smem)
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, smem)
        r = _OCC[key] = max(per_sm, 1) * _compile.sm_count(dev)
    return r


def plan(dtype, rows, n, op=OP_SOFTMAX, method="online", aligned=True, sms=132, partition=None, residency=None,
         cc=None):
    """The Plan for ``rows`` rows of ``n`` elements (pure arithmetic; tests and experiments read it).

    ``aligned``: every row starts on a 16-byte boundary (else one extra slot is allowed for the head).
    ``cc``: the device's compute capability (``90`` for the H200; None: unknown, no cluster path).
    ``partition`` (study knob): ``threads`` (block size of the block path), ``chunks`` (K, chunks per row),
    ``chunk_slots`` (the split's chunk size), ``lag`` (how many tickets the split's phase 2 trails),
    ``single_read`` (False forces the two-launch streaming path),
    ``split="registers"`` (the register-held split of version 1, with ``max_chunk_slots``; ``residency(threads)``
    bounds its K by the blocks that fit on the GPU, None: 2 per SM),
    ``path="cluster"`` (forces the cluster split, any row length; needs cc >= 90) with ``cluster`` (C, blocks per
    row; default: chosen as below), ``clusters`` (clusters launched; rows beyond them go cluster-stride),
    ``hold_bytes`` (shared memory per block for the row; the rest streams) and ``copy`` ("bulk" or "cp.async": how
    a block copies its segment; default: ``CLUSTER_BULK_SIZES``), ``cluster=0`` (never the cluster path).
    """
    p = partition or {}
    vec = 16 // np.dtype(dtype).itemsize
    nv = _nv(dtype)
    slots = -(-(n + (0 if aligned else vec - 1)) // vec)
    stream = method != "online" or p.get("single_read") is False
    reduce_only = op >= OP_LSE
    if p.get("copy") is not None and p["copy"] not in CLUSTER_COPIES:  # checked whichever path the call takes
        raise ValueError(f"partition copy must be one of {CLUSTER_COPIES}, got {p['copy']!r}")
    hp = _held_plan(dtype, rows, n, slots, stream, reduce_only, sms, p, cc)
    if hp is not None:
        return hp
    cl = _cluster_plan(dtype, rows, n, slots, stream, reduce_only, sms, p, cc)
    if cl is not None:
        return cl
    if not stream and "threads" not in p and "chunks" not in p and slots <= WARP_GROUPS[-1] * nv:
        g = min(_pow2_at_least(slots / nv), WARP_GROUPS[-1])
        return Plan("warp", WARP_THREADS, g, 1, slots)
    row_threads = max(BLOCK_THREADS[0], _pow2_at_least(slots / nv))
    wide = (not stream and "threads" not in p and "chunks" not in p and rows >= sms and nv == NV
            and BLOCK_THREADS[-1] * nv < slots <= BLOCK_THREADS[-1] * 2 * nv and p.get("split") is None)
    if wide:  # one block per row still: 512 threads x 16 slots
        return Plan("block", BLOCK_THREADS[-1], BLOCK_THREADS[-1], 1, slots)
    if not stream and "chunks" not in p and row_threads <= BLOCK_THREADS[-1] and (rows >= sms or reduce_only):
        t = p.get("threads", row_threads)
        if t in BLOCK_THREADS and t * nv >= slots:
            return Plan("block", t, t, 1, slots)
    if not stream and not reduce_only and p.get("split") == "registers":  # version 1 with K > 1 (study)
        cap = p.get("max_chunk_slots", SPLIT_MAX_THREADS * nv)
        k = p.get("chunks") or max(-(-slots // cap), min(-(-2 * sms // max(rows, 1)), -(-slots // 512)), 1)
        s = -(-slots // k)
        t = p.get("threads") or max(BLOCK_THREADS[0], _pow2_at_least(s / nv))
        if t in BLOCK_THREADS and t * nv >= s and (k == 1 or k <= (residency(t) if residency else 2 * sms)):
            return Plan("split_regs" if k > 1 else "block", t, t, k, s)
    elif not stream and not reduce_only and np.dtype(dtype) != _dtypes.float64:  # version 3
        cap = p.get("chunk_slots", SPLIT_CHUNK_SLOTS * (2 if np.dtype(dtype).itemsize == 2 else 1))
        k = p.get("chunks") or max(-(-slots // cap), min(-(-2 * sms // max(rows, 1)), -(-slots // SPLIT_MIN_SLOTS)), 1)
        if k > 1 or row_threads > BLOCK_THREADS[-1]:
            return Plan("split", SPLIT_THREADS, SPLIT_THREADS, k, -(-slots // k))
        return Plan("block", row_threads, row_threads, 1, slots)
    u = STREAM_THREADS[-1] * STREAM_UNROLL
    k = p.get("chunks") or max(1, min(-(-slots // u), -(-4 * sms // max(rows, 1))))
    s = -(-slots // k)
    t = STREAM_THREADS[0] if s <= 2 * STREAM_THREADS[0] * STREAM_UNROLL else STREAM_THREADS[-1]
    return Plan("stream", t, t, k, s)


_STUDY_KEYS = ("threads", "chunks", "chunk_slots", "lag", "split", "max_chunk_slots", "single_read")


def _held_plan(dtype, rows, n, slots, stream, reduce_only, sms, p, cc):
    """The held split's Plan (``path="held"``), or None for the other paths.

    Automatic (softmax/log_softmax, method "online", 16/32-bit types, cc in ``HELD_CC``, rows of at least
    ``HELD_ROW_BYTES`` and chunks for every resident block, no study knob) with ``HELD_CONFIG``;
    ``partition={"path": "held"}`` forces it (``config``: one of ``HELD_CONFIGS``). K chunks a row of at most ``HELD_THREADS`` x spt slots, spread evenly;
    K must not exceed the resident blocks + 1 (estimated here by ``_held_per_sm``; the launch checks the driver's
    count): longer rows keep the split."""
    forced = p.get("path") == "held"
    if not forced:
        if (HELD_ROW_BYTES is None or p.get("held") == 0 or p.get("path") is not None or stream or reduce_only
                or any(k in p for k in _STUDY_KEYS) or "cluster" in p or cc is None or int(cc) not in HELD_CC
                or np.dtype(dtype).itemsize not in (2, 4) or n * np.dtype(dtype).itemsize < HELD_ROW_BYTES):
            return None
    else:
        if stream or reduce_only or np.dtype(dtype).itemsize not in (2, 4):
            raise ValueError("the held path runs softmax/log_softmax with method='online' on float16, bfloat16 and "
                             "float32")
        if cc is None or int(cc) < 90:
            raise _compile.ConfigurationError(f"the held path needs compute capability >= 9.0 (device: {cc})")
    cfg = tuple(p.get("config", HELD_CONFIG))
    if cfg not in HELD_CONFIGS:
        raise ValueError(f"partition config must be one of {HELD_CONFIGS}, got {cfg!r}")
    k = -(-slots // (HELD_THREADS * cfg[0]))
    if k > _held_per_sm(cfg) * sms + 1:
        if forced:
            raise ValueError(f"rows of {n} elements are too long for the held path ({k} chunks a row)")
        return None
    if not forced and rows * k < _held_per_sm(cfg) * sms:  # too few chunks to fill the resident blocks
        return None
    return Plan("held", HELD_THREADS, HELD_THREADS, k, -(-slots // k), cfg)


def _cluster_row_bytes(dtype):
    """The row lengths in bytes the cluster path takes automatically for ``dtype`` ((lo, hi)), or None."""
    return None if CLUSTER_ROW_BYTES is None else CLUSTER_ROW_BYTES.get(np.dtype(dtype).itemsize)


def _cluster_plan(dtype, rows, n, slots, stream, reduce_only, sms, p, cc):
    """The cluster path's Plan, or None for the other paths.

    Automatic (softmax/log_softmax, method "online", 16/32-bit types, cc >= 90, rows of ``CLUSTER_ROW_BYTES``, no
    other study knob): C is the smallest cluster size whose segments fit ``CLUSTER_SEGMENT_BYTES`` and whose
    blocks (rows x C) cover the SMs, else the largest (sizes above ``CLUSTER_PORTABLE`` on
    ``CLUSTER_NON_PORTABLE_CC`` only); with fewer than ``sms`` blocks, or segments over
    ``CLUSTER_MAX_SEGMENT_BYTES``, the split (which cuts a row over many blocks) is kept.
    ``partition={"path": "cluster"}`` forces it for any row length (and any size of ``CLUSTER_SIZES``).
    The copy: bulk copies for the sizes in ``CLUSTER_BULK_SIZES`` when the whole segment is held (it fits
    ``CLUSTER_HOLD_BYTES``, or ``hold_bytes`` when given; lse and the state hold nothing unless told), else
    cp.async; ``partition["copy"]`` overrides (ValueError for anything but ``CLUSTER_COPIES``, on every path).
    """
    forced = p.get("path") == "cluster"
    if p.get("path") not in (None, "cluster"):
        raise ValueError(f"partition path must be 'cluster' or 'held' when given, got {p.get('path')!r}")
    bounds = _cluster_row_bytes(dtype)
    in_range = bounds is not None and bounds[0] <= n * np.dtype(dtype).itemsize <= bounds[1]
    if not forced and (p.get("cluster") == 0 or not in_range or reduce_only or any(k in p for k in _STUDY_KEYS)):
        return None
    if stream or np.dtype(dtype) == _dtypes.float64:
        if forced:
            raise ValueError("the cluster path runs method='online' (single read) on float16, bfloat16 and float32")
        return None
    if cc is None or int(cc) < 90:
        if forced:
            raise _compile.ConfigurationError(f"the cluster path needs compute capability >= 9.0 (device: {cc})")
        return None
    itemsize = np.dtype(dtype).itemsize
    c = p.get("cluster")
    if c is None or c == 0:
        row_bytes = n * itemsize
        sizes = [k for k in CLUSTER_SIZES if k <= CLUSTER_PORTABLE or int(cc) in CLUSTER_NON_PORTABLE_CC]
        c = next((k for k in sizes if row_bytes <= k * CLUSTER_SEGMENT_BYTES and rows * k >= sms), sizes[-1])
        if not forced and (rows * c < sms or row_bytes > c * CLUSTER_MAX_SEGMENT_BYTES):
            return None
    if c not in CLUSTER_SIZES:
        raise ValueError(f"cluster size must be one of {CLUSTER_SIZES}, got {c!r}")
    seg = -(-slots // c)
    if seg * (16 // itemsize) >= 1 << 30:  # offsets inside a segment are 32-bit
        if forced:
            raise ValueError(f"rows of {n} elements are too long for the cluster path (C = {c})")
        return None
    copy = p.get("copy")
    if copy is None:  # bulk where measured faster: those sizes, the segment held whole (lse/state hold nothing)
        hold = int(p.get("hold_bytes", 0 if reduce_only else CLUSTER_HOLD_BYTES))
        copy = "bulk" if c in CLUSTER_BULK_SIZES and 0 < seg * 16 <= hold else "cp.async"
    return Plan("cluster", CLUSTER_THREADS, CLUSTER_THREADS, c, seg, copy)


def _cluster_hold(pl, op, partition, dev, kernel):
    """Slots of a segment held in shared memory: the segment up to ``CLUSTER_HOLD_BYTES`` (``hold_bytes``), within
    the device's opt-in limit less the kernel's static shared memory; lse/state stream (0) unless told."""
    p = partition or {}
    if op >= OP_LSE and "hold_bytes" not in p:
        return 0
    cap = min(int(p.get("hold_bytes", CLUSTER_HOLD_BYTES)),
              _compile.max_shared_optin(dev) - int(kernel.shared_size_bytes))
    return max(0, min(pl.slots_per_chunk, cap // 16))


# ----------------------------------------------------------------------------------------------------------
# launching. A call is prepared once per (shape, strides, dtype, alignment, axis, op, method, device, partition):
# the plan, the kernels and the scalar arguments are kept, so a repeated call costs a dict lookup, an output
# allocation and the launch (host overhead).
_NUL = np.uint64(0)
_PREP: dict = {}


class _Prep:
    __slots__ = ("rows", "n", "direct", "perm", "moved_shape", "out_shape", "plan", "kernels", "args", "grid",
                 "block", "acc", "chunks", "smem")


def _i64(v):
    return np.int64(v)


def _prepare(x, axis, op, method, partition):
    import cupy

    _check_method(method)  # the argument errors come first, before any device query
    axes = _axes(axis, x.ndim)
    if op < OP_LSE and math.prod(x.shape[i] for i in axes) == 0:  # scipy's error for an empty softmax axis
        raise ValueError(f"zero-size array to reduction operation maximum which has no identity (shape {x.shape}, "
                         f"axis {axis})")
    dev = cupy.cuda.runtime.getDevice()
    key = (x.shape, x.strides, x.dtype, x.data.ptr & 15, axes, op, method, dev,
           None if partition is None else tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                       for k, v in partition.items())))
    pr = _PREP.get(key)
    if pr is None:
        pr = _make_prep(x, axis, op, method, partition, dev)
        if len(_PREP) > 4096:
            _PREP.clear()
        _PREP[key] = pr
    return pr


def _make_prep(x, axis, op, method, partition, dev):
    _check_method(method)
    dt = x.dtype
    axes = _axes(axis, x.ndim)
    pr = _Prep()
    pr.acc = _dtypes.float64 if dt == _dtypes.float64 else _dtypes.float32
    pr.rows = math.prod(x.shape[i] for i in range(x.ndim) if i not in axes)
    pr.n = math.prod(x.shape[i] for i in axes)
    pr.plan = None  # (softmax over an empty axis was refused by _prepare)
    keep = tuple(i for i in range(x.ndim) if i not in axes)
    pr.perm = keep + axes
    pr.moved_shape = tuple(x.shape[i] for i in pr.perm)
    pr.out_shape = tuple(x.shape[i] for i in keep)
    if pr.rows == 0 or pr.n == 0:
        return pr
    x2 = _rows_of(x, pr.perm, pr.rows, pr.n)
    isz = dt.itemsize
    ldx = x2.strides[0] // isz if pr.rows > 1 else pr.n
    # direct: x's own pointer serves (a view); softmax needs input and output rows at the same 16-byte offset
    pr.direct = x2.data.ptr == x.data.ptr and (
        op >= OP_LSE or (x2.data.ptr % 16 == 0 and (pr.rows == 1 or ((ldx - pr.n) * isz) % 16 == 0)))
    if not pr.direct:
        x2 = _contiguous(x2)
        ldx = pr.n
    aligned = x2.data.ptr % 16 == 0 and (pr.rows == 1 or (ldx * isz) % 16 == 0)
    sms = _compile.sm_count(dev)
    ct = _dtypes.CTYPE[dt]

    def residency(t):
        return _residency(_compile.get_kernel(SOURCE, _cached_name(ct, t, t)), t)

    cc = _compile.compute_capability(dev)
    pl = pr.plan = plan(dt, pr.rows, pr.n, op, method, aligned, sms, partition, residency, cc)
    if pl.path == "held":  # the planner estimated the resident blocks: the driver's count decides
        held_kernel = _compile.get_kernel(SOURCE, _held_name(ct, pl.copy), CLUSTER_ARCH_OPTIONS)
        held_smem = _held_smem(pl.copy, pl.slots_per_chunk)
        held_blocks = _residency(held_kernel, pl.threads, held_smem)
        if pl.chunks > held_blocks + 1:
            if (partition or {}).get("path") == "held":
                raise _compile.ConfigurationError(f"softmax_hold: {pl.chunks} chunks a row need {pl.chunks - 1} "
                                                  f"resident blocks, the device holds {held_blocks}")
            pl = pr.plan = plan(dt, pr.rows, pr.n, op, method, aligned, sms, dict(partition or {}, held=0),
                                residency, cc)
    rows, n = pr.rows, pr.n
    pr.chunks = pl.chunks
    pr.smem = 0
    if pl.path == "cluster":
        k = _compile.get_kernel(SOURCE, _cluster_name(ct, pl.chunks, pl.copy), CLUSTER_ARCH_OPTIONS)
        if pl.chunks > CLUSTER_PORTABLE:
            _compile.allow_non_portable_cluster(k)
        pr.kernels = (k,)
        hold = _cluster_hold(pl, op, partition, dev, k)
        pr.smem = hold * 16
        clusters = min(rows, int((partition or {}).get("clusters") or CLUSTER_MAX_CLUSTERS))
        pr.grid = (clusters * pl.chunks,)
        pr.block = (pl.threads,)
        pr.args = (_i64(ldx), _i64(n), _i64(rows), _i64(n), np.int32(op), _i64(pl.slots_per_chunk), np.int32(hold))
    elif pl.path == "held":
        pr.kernels = (held_kernel,)
        pr.smem = held_smem
        pr.grid = (min(held_blocks, rows * pl.chunks),)
        pr.block = (pl.threads,)
        pr.args = (_i64(ldx), _i64(n), _i64(rows), _i64(n), np.int32(op), np.int32(pl.chunks),
                   np.int32(pl.slots_per_chunk))
    elif pl.path == "split":
        k = _compile.get_kernel(SOURCE, _split_name(ct))
        pr.kernels = (k,)
        total = rows * pl.chunks
        # D: phase 2 trails phase 1 by D tickets (>= K: no deadlock); small enough that the D chunks read in
        # between stay in L2 (2 x SMs chunks of 32 KiB = 8.4 MiB on the H200)
        lag = max(pl.chunks, (partition or {}).get("lag") or min(total, 2 * sms))
        pr.grid = (total + lag,)
        pr.block = (pl.threads,)
        pr.args = (_i64(ldx), _i64(n), _i64(rows), _i64(n), np.int32(op), np.int32(pl.chunks),
                   _i64(pl.slots_per_chunk), _i64(lag))
    elif pl.path in ("warp", "block", "split_regs"):
        wide = pl.group * _nv(dt) < pl.slots_per_chunk and pl.chunks == 1  # the 512 x 16 block
        name = _cached_name(ct, pl.group, pl.threads, 2 * NV if wide else None)
        pr.kernels = (_compile.get_kernel(SOURCE, name),)
        pr.grid = (rows * pl.chunks,) if pl.group > 32 else (-(-rows // (pl.threads // pl.group)),)
        pr.block = (pl.threads,)
        pr.args = (_i64(ldx), _i64(n), _i64(rows), _i64(n), np.int32(op), np.int32(pl.chunks),
                   np.int32(pl.slots_per_chunk))
    else:
        pr.kernels = tuple(_compile.get_kernel(SOURCE, nm) for nm in _stream_names(ct, pl.threads))
        pr.grid = (rows * pl.chunks,)
        pr.block = (pl.threads,)
        pr.args = (_i64(ldx), _i64(n), _i64(rows), _i64(n), np.int32(pl.chunks), _i64(pl.slots_per_chunk),
                   np.int32(op))
    return pr


def _rows_of(x, perm, rows, n):
    """x with its reduced axes last, as (rows, n) with a contiguous last axis: a view when the layout allows."""
    xt = x if perm == tuple(range(x.ndim)) else x.transpose(perm)
    x2 = xt.reshape(rows, n)  # CuPy copies only when no view exists
    if n > 1 and x2.strides[1] != x2.itemsize:
        x2 = _contiguous(x2)
    return x2


def _exec(pr, x, op, method, y=_NUL, om=_NUL, ol=_NUL):
    """Launch the prepared kernels over x's rows; outputs: y ((rows, n) softmax, (rows,) lse), om/ol (state)."""
    import cupy

    x2 = x if pr.direct else _contiguous(_rows_of(x, pr.perm, pr.rows, pr.n))
    pl = pr.plan
    if pl.path == "cluster":
        ldx, ldy, rows, n, a_op, seg, hold = pr.args
        _compile.launch(pr.kernels[0], pr.grid, pr.block, (x2, ldx, y, ldy, rows, n, a_op, om, ol, seg, hold),
                        shared_mem=pr.smem, what="softmax_cluster")
        return
    if pl.path == "held":
        ws = cupy.zeros(pr.rows * pl.chunks, dtype=np.uint64)  # one word per chunk: its state, 0 until published
        ldx, ldy, rows, n, a_op, K, S = pr.args
        _compile.launch(pr.kernels[0], pr.grid, pr.block, (x2, ldx, y, ldy, rows, n, a_op, K, S, ws),
                        shared_mem=pr.smem, what="softmax_hold", cooperative=True)
        return
    if pl.path == "split":
        ws = cupy.zeros(1 + pr.rows * pl.chunks, dtype=np.uint64)  # [0]: the ticket; then one word per chunk
        ldx, ldy, rows, n, a_op, K, S, lag = pr.args
        pr.kernels[0](pr.grid, pr.block, (x2, ldx, y, ldy, rows, n, a_op, K, S, lag, ws[1:], ws[:1]))
        return
    ldx, ldy, rows, n, a4, a5, a6 = pr.args
    if pl.path in ("warp", "block", "split_regs"):
        if pl.chunks > 1:
            counters = cupy.zeros(pr.rows + 1, dtype=np.int32)
            ws = cupy.empty((pr.rows * pl.chunks, 2), dtype=pr.acc)
        else:
            counters = ws = _NUL
        pr.kernels[0](pr.grid, pr.block, (x2, ldx, y, ldy, rows, n, a4, om, ol, a5, a6, counters, ws))
        return
    kp, kn, kf = pr.kernels
    K, S = a4, a5
    ws = cupy.empty((pr.rows * pl.chunks, 2), dtype=pr.acc)
    if method == "safe":
        wmax = cupy.empty_like(ws)
        kp(pr.grid, pr.block, (x2, ldx, rows, n, K, S, np.int32(MODE_MAX), _NUL, wmax))
        kp(pr.grid, pr.block, (x2, ldx, rows, n, K, S, np.int32(MODE_SUMEXP), wmax, ws))
    else:
        mode = MODE_NAIVE if method == "naive" else MODE_ONLINE
        kp(pr.grid, pr.block, (x2, ldx, rows, n, K, S, np.int32(mode), _NUL, ws))
    if op >= OP_LSE:
        kf((-(-pr.rows * 32 // 256),), (256,), (rows, K, np.int32(op), ws, y, om, ol))
    else:
        kn(pr.grid, pr.block, (x2, ldx, y, ldy, rows, n, K, S, np.int32(op), ws))


def _check_method(method):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _softmax_impl(x, axis=None, op=OP_SOFTMAX, method="online", partition=None, return_plan=False):
    """softmax (op 0) or log_softmax (op 1) of x over axis; ``partition`` is the study knob of :func:`plan`."""
    import cupy

    x = _as_cupy(x)
    if x.dtype not in _SUPPORTED:
        _check_dtype(x.dtype)
    if x.ndim == 0:
        if not (isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)) and axis in (0, -1)):
            _axes(axis, 0)  # numpy's reductions (so scipy) take an int axis 0 or -1 on a 0-d array, not (0,)
        r = _softmax_impl(x.reshape(1), None, op, method, partition, return_plan)
        return (r[0].reshape(()), r[1]) if return_plan else r.reshape(())
    pr = _prepare(x, axis, op, method, partition)
    if pr.plan is None:  # an empty array with a non-empty reduced axis
        y = cupy.empty(x.shape, dtype=x.dtype)
        return (y, None) if return_plan else y
    if pr.perm == tuple(range(x.ndim)):
        y = cupy.empty(x.shape, dtype=x.dtype)
        _exec(pr, x, op, method, y=y)
    else:
        y = cupy.empty(pr.moved_shape, dtype=x.dtype)
        _exec(pr, x, op, method, y=y)
        y = y.transpose(np.argsort(pr.perm))
    return (y, pr.plan) if return_plan else y


def softmax(x, axis=None, *, method="online"):
    """``scipy.special.softmax`` on the GPU: ``exp(x − max) / sum(exp(x − max))`` over ``axis``.

    The online-softmax state (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax",
    Algorithm 3): a running ``(m, l)`` per thread, merged with ``m = max(ma, mb)``,
    ``l = la·e^(ma−m) + lb·e^(mb−m)`` through warp shuffles, shared memory and blocks; the row is then
    normalised from one more read (or from on-chip memory when it fits: one HBM read, one write).

    Args:
        x: CuPy array (or a CUDA array via DLPack), float16, bfloat16, float32 or float64, any shape and
            strides; the reduced axes are moved last without a copy where the layout allows.
        axis: int, tuple of ints, or None (all axes), as scipy.
        method: ``"online"`` (default), ``"safe"`` (three passes: max, sum, normalise) or ``"naive"`` (no max
            subtraction: overflows for large inputs, by design, for the overflow experiment).

    Returns:
        CuPy array of ``x``'s shape and dtype; accumulation in float32 (float64 for float64 input). Edge values
        as scipy: a row of all −inf or with a +inf gives NaN, NaN propagates.

    Raises:
        TypeError: not a CuPy/CUDA array, an integer, bool or complex dtype, or an axis that is not None, an
            int or a tuple of ints.
        ValueError: axis out of range or repeated, an empty reduction, an unknown method. All before any launch.
    """
    return _softmax_impl(x, axis, OP_SOFTMAX, method)


def log_softmax(x, axis=None, *, method="online"):
    """``scipy.special.log_softmax`` on the GPU: ``(x − m) − log(l)`` over ``axis`` from the online state
    ``(m, l)`` (Milakov & Gimelshein 2018), with no exp/log round trip of the output.

    Arguments, dtypes, paths and errors as :func:`softmax`. Returns an array of ``x``'s shape and dtype; a row
    of all −inf gives NaN (as scipy), a −inf entry in a finite row gives −inf.
    """
    return _softmax_impl(x, axis, OP_LOG_SOFTMAX, method)


def _reduce_impl(x, axis, op, method="online", partition=None, return_plan=False):
    """lse (op 2, dtype of x) or state (op 3, accumulator dtype) of x over axis; outputs shaped x.shape less the
    reduced axes."""
    import cupy

    pr = _prepare(x, axis, op, method, partition)
    if op == OP_LSE:
        res = cupy.empty(pr.out_shape, dtype=x.dtype)
        if pr.n == 0:
            res.fill(-np.inf)
        elif pr.rows:
            _exec(pr, x, op, method, y=res)
    else:
        m, l = cupy.empty(pr.out_shape, dtype=pr.acc), cupy.empty(pr.out_shape, dtype=pr.acc)
        if pr.n == 0:
            m.fill(-np.inf)
            l.fill(0)
        elif pr.rows:
            _exec(pr, x, op, method, om=m, ol=l)
        res = (m, l)
    return (res, pr.plan) if return_plan else res


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False, *, method="online"):
    """``scipy.special.logsumexp`` on the GPU: log(sum(b · exp(a))) over ``axis``, without overflow.

    Without ``b`` the row-reduction kernels compute the online-softmax state ``(m, l)`` and return
    ``lse = m + log(l)`` (Milakov & Gimelshein 2018, Algorithm 3 without its normalising pass). With ``b`` the
    kernels are not used: scipy's weighted algorithm runs step by step as CuPy array operations (``b == 0``
    entries are dropped; negative weights need ``return_sign=True`` or give NaN).

    Args:
        a: CuPy array (or a CUDA array via DLPack), float16, bfloat16, float32 or float64, any shape and strides;
            a 0-d ``a`` is treated as shape (1,) (scipy's ``atleast_1d``).
        axis: int, tuple of ints, or None (all axes), as scipy.
        b: None, a real scalar, or a CuPy array of a real dtype (float, int, uint or bool) that broadcasts
            against ``a``.
        keepdims: keep the reduced axes with length 1, as scipy.
        return_sign: also return the sign of the sum (then negative sums give a finite result, not NaN).
        method: ``"online"`` (default), ``"safe"`` (separate max pass, then the sum) or ``"naive"`` (no max
            subtraction: overflows, by design). Only without ``b``: with ``b`` it is validated and then ignored.

    Returns:
        ``lse``, natural log: ``a``'s shape (the broadcast shape with ``b``) without the reduced axes (length 1
        with ``keepdims``). Dtype: ``a.dtype`` without ``b`` (bfloat16 stays bfloat16, unlike scipy); with ``b``
        ``numpy.result_type(a, b)`` (a Python scalar ``b``, or any real scalar with a bfloat16 ``a``, keeps
        ``a.dtype``; int64 weights promote float16/float32 ``a`` to float64; integer or bool weights with a
        bfloat16 ``a`` promote as with a float16 one, bfloat16 in place of float16: int8/uint8/bool keep
        bfloat16, int16 gives float32, int32/int64 float64). Accumulation in float32 (float64
        for a float64 result). With ``return_sign``: ``(lse, sign)``, ``sign`` of the same shape and dtype
        (+1, −1 for a negative weighted sum, 0 where the sum is 0, NaN for NaN; −1 over an empty axis, as
        scipy). Edge values as scipy: an empty or all −inf reduction gives −inf, +inf entries +inf, NaN
        propagates; an empty array with ``axis=None`` gives −inf (scipy raises IndexError for ndim >= 2).

    Raises:
        TypeError: ``a`` not a CuPy/CUDA array or not float16/bfloat16/float32/float64; ``b`` neither a real
            scalar nor a CuPy/CUDA array of a real dtype (bool and complex scalars, host arrays); ``a`` and ``b``
            with no common supported dtype (e.g. bfloat16 with float16); an axis that is not None, an int or a
            tuple of ints; ``keepdims`` or ``return_sign`` not a bool (or 0 / 1).
        ValueError: axis out of range or repeated, an unknown method (also with ``b``), ``b`` not broadcasting
            against ``a``. All before any launch.
    """
    import cupy

    a = _as_cupy(a, "a")
    keepdims, return_sign = as_bool(keepdims, "logsumexp: keepdims"), as_bool(return_sign, "logsumexp: return_sign")
    if b is not None:
        _check_method(method)
        return _logsumexp_weighted(a, axis, b, keepdims, return_sign)
    if a.dtype not in _SUPPORTED:
        _check_dtype(a.dtype, "a")
    if a.ndim == 0:
        a = a.reshape(1)  # scipy: atleast_1d
    out = _reduce_impl(a, axis, OP_LSE, method)
    if not keepdims and not return_sign:
        return out
    axes = _axes(axis, a.ndim)
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else s for i, s in enumerate(a.shape)))
    if not return_sign:
        return out
    if math.prod(a.shape[i] for i in axes) == 0:
        sgn = cupy.full(out.shape, -1, dtype=a.dtype)  # scipy: sign(-inf)
    else:  # +1 for a finite or +inf result, 0 where the sum was 0 (-inf), NaN for NaN
        sgn = cupy.where(out == -np.inf, 0, 1).astype(a.dtype)
        sgn[cupy.isnan(out)] = np.nan
    return out, sgn


def _logsumexp_weighted(a, axis, b, keepdims, return_sign):
    """scipy.special.logsumexp's algorithm with weights, in CuPy, accumulating in float32 (float64)."""
    import cupy

    _check_dtype(a.dtype, "a")
    scalar = isinstance(b, (int, float, np.number)) and not isinstance(b, (bool, np.bool_, complex,
                                                                            np.complexfloating))
    if not scalar and isinstance(b, np.generic) and b.dtype == _dtypes.bfloat16:  # ml_dtypes' scalar type
        scalar = True
    if scalar:
        out_dt = np.result_type(a.dtype, b) if a.dtype != _dtypes.bfloat16 else a.dtype
    else:
        b = _as_cupy(b, "b")
        if b.dtype not in _SUPPORTED and b.dtype.kind not in "fiub":
            raise TypeError(f"b has dtype {b.dtype}; expected a real array")
        try:
            if a.dtype == _dtypes.bfloat16 and b.dtype.kind in "iub":  # NumPy has no rule: float16's, in bfloat16
                out_dt = np.result_type(np.float16, b.dtype)
                out_dt = a.dtype if out_dt == np.float16 else out_dt
            else:
                out_dt = np.result_type(a.dtype, b.dtype)
        except Exception:
            raise TypeError(f"no common dtype for a ({a.dtype}) and b ({b.dtype})") from None
        if out_dt not in _SUPPORTED and out_dt.kind != "f":  # integer/bool weights: scipy's float64
            out_dt = np.dtype(np.float64)
    out_dt = _check_dtype(out_dt, "logsumexp(a, b)")
    b_shape = () if scalar else b.shape
    try:  # shapes and axes checked before anything touches the device
        shape = np.broadcast_shapes(a.shape, b_shape)
    except ValueError as e:
        raise ValueError(f"b (shape {b_shape}) does not broadcast against a (shape {a.shape}): {e}") from None
    _axes(axis, max(len(shape), 1))
    if scalar:
        b = cupy.asarray(b, dtype=out_dt)
    acc = np.float64 if out_dt == _dtypes.float64 else np.float32
    a, b = cupy.broadcast_arrays(a.astype(acc), b.astype(acc))
    if a.ndim == 0:
        a, b = a.reshape(1), b.reshape(1)
    axes = _axes(axis, a.ndim)
    keep_shape = tuple(1 if i in axes else s for i, s in enumerate(a.shape))
    if a.size == 0 or math.prod(a.shape[i] for i in axes) == 0:
        out = cupy.full(keep_shape, -np.inf, dtype=acc)
        sgn = cupy.full(keep_shape, -1, dtype=acc)
    else:
        # the steps of scipy.special._logsumexp, in the same order
        s_dir = cupy.sum(b * cupy.exp(a), axis=axes, keepdims=True)  # scipy's fallback where the result is not finite
        sgn_inf = cupy.sign(s_dir)
        out_inf = cupy.log(cupy.abs(s_dir) if return_sign else s_dir)
        a = cupy.where(b == 0, -np.inf, a)
        a_max = cupy.max(a, axis=axes, keepdims=True)
        i_max = a == a_max
        m = cupy.sum(cupy.where(i_max, b, 0), axis=axes, keepdims=True)
        s = cupy.sum(b * cupy.exp(cupy.where(i_max, -np.inf, a) - a_max), axis=axes, keepdims=True)
        s = cupy.where(s == 0, s, s / m)
        sgn = cupy.sign(s + 1) * cupy.sign(m)
        s = cupy.where(s < -1, -s - 2, s)
        out = cupy.log1p(s) + cupy.log(cupy.abs(m)) + a_max
        if not return_sign:
            out = cupy.where(sgn < 0, np.nan, out)
        fin = cupy.isfinite(out)
        out = cupy.where(fin, out, out_inf)
        sgn = cupy.where(fin, sgn, sgn_inf)
    if not keepdims:
        out, sgn = out.reshape(_drop(keep_shape, axes)), sgn.reshape(_drop(keep_shape, axes))
    out, sgn = out.astype(out_dt), sgn.astype(out_dt)
    return (out, sgn) if return_sign else out


def _drop(shape, axes):
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def online_softmax_state(x, axis=-1, *, method="online"):
    """The online-softmax state of x over ``axis``: ``(m, l)`` with m = max(x), l = sum(exp(x − m)).

    The running ``(m, d)`` pair of Milakov & Gimelshein 2018, Algorithm 3 (their ``d`` is ``l`` here), reduced
    over threads, warps and blocks; states combine with :func:`merge_states` and give the log-sum-exp with
    :func:`lse_from_state`.

    Args:
        x: CuPy array (or a CUDA array via DLPack), float16, bfloat16, float32 or float64, any shape and strides;
            a 0-d ``x`` is treated as shape (1,).
        axis: int (default −1, the last axis), tuple of ints, or None (all axes).
        method: ``"online"`` (default), ``"safe"`` (separate max pass, then the sum) or ``"naive"`` (no max
            subtraction: ``m = 0``, ``l = sum(exp(x))``, which overflows, by design).

    Returns:
        ``(m, l)``: two CuPy arrays of x's shape without the reduced axes, float32 (float64 for float64 x).
        An empty or all −inf slice gives (−inf, 0); a slice holding +inf gives (+inf, number of +inf entries),
        so that ``lse_from_state`` equals ``logsumexp``; NaN gives NaN.

    Raises:
        TypeError: not a CuPy/CUDA array, an integer, bool or complex dtype, or an axis that is not None, an int
            or a tuple of ints.
        ValueError: axis out of range or repeated, an unknown method. All before any launch.
    """
    x = _as_cupy(x)
    _check_dtype(x.dtype)
    if x.ndim == 0:
        x = x.reshape(1)
    return _reduce_impl(x, axis, OP_STATE, method)


def merge_states(a, b):
    """Merge two states (or arrays of states, broadcast): m = max(ma, mb), l = la·e^(ma−m) + lb·e^(mb−m).

    The ⊕ operator of Milakov & Gimelshein 2018 (parallel online normalizer calculation), in one kernel.
    Exact about −inf: merging two empty states (−inf, 0) gives (−inf, 0) (no exp(−inf − −inf)), merging an empty
    state into (m, l) returns (m, l) unchanged. NaN propagates.

    Args:
        a, b: states ``(m, l)`` as :func:`online_softmax_state` returns: pairs of CuPy float32/float64 arrays or
            real scalars (NumPy scalars: float64 for ``numpy.float64``, else float32; Python numbers take float64
            when another entry is float64, else float32, as NumPy's weak scalars); the four arrays broadcast
            against each other.

    Returns:
        ``(m, l)``: two new C-contiguous CuPy arrays of the broadcast shape, float64 if any input is float64,
        else float32.

    Raises:
        TypeError: ``a`` or ``b`` not a pair; an entry that is neither a CuPy/CUDA array nor a real scalar (a
            NumPy array or a bool included); an array not float32/float64.
        ValueError: shapes that do not broadcast.
    """
    import cupy

    (ma, la), (mb, lb) = _pair(a, "merge_states"), _pair(b, "merge_states")
    arrs = _state_arrays(ma, la, mb, lb)
    acc = np.result_type(*[x.dtype for x in arrs])
    try:
        arrs = cupy.broadcast_arrays(*arrs)
    except ValueError as e:
        raise ValueError(f"state shapes do not broadcast: {[x.shape for x in arrs]}") from e
    shape = arrs[0].shape
    ma, la, mb, lb = (cupy.ascontiguousarray(x, dtype=acc) for x in arrs)
    m, l = cupy.empty(shape, dtype=acc), cupy.empty(shape, dtype=acc)
    count = m.size
    if count:
        k = _compile.get_kernel(SOURCE, f"cuflash::softmax_merge_states<{_dtypes.CTYPE[np.dtype(acc)]}>")
        k((min(-(-count // 256), 65535),), (256,), (ma, la, mb, lb, m, l, _i64(count)))
    return m, l


def _pair(state, what):
    """``state`` unpacked as (m, l): a tuple, list or array pair (a dict, set or string raises TypeError)."""
    if isinstance(state, (dict, set, frozenset, str, bytes)):
        raise TypeError(f"{what}: a state is a pair (m, l), got {type(state).__name__}")
    try:
        m, l = state
    except (TypeError, ValueError):
        raise TypeError(f"{what}: a state is a pair (m, l)") from None
    return m, l


def _state_arrays(*xs):
    """The arrays of one or two states as CuPy arrays; TypeError unless float32/float64. Real scalars are allowed:
    NumPy scalars keep their precision (float64 for numpy.float64, else float32), Python numbers are weak (NumPy's
    rule): float64 when another entry is float64, else float32."""
    import cupy

    arrs = []
    for x in xs:
        if not isinstance(x, (float, int, np.floating, np.integer)) or isinstance(x, (bool, np.bool_)):
            arrs.append(_as_cupy(x, "state"))
        elif isinstance(x, np.generic):
            arrs.append(cupy.asarray(x, dtype=np.float64 if isinstance(x, np.float64) else np.float32))
        else:
            arrs.append(None)  # a Python number: converted below, with the precision of the others
    weak = np.float64 if any(a is not None and a.dtype == np.float64 for a in arrs) else np.float32
    arrs = [cupy.asarray(x, dtype=weak) if a is None else a for a, x in zip(arrs, xs)]
    for x in arrs:
        if x.dtype not in (_dtypes.float32, _dtypes.float64):
            raise TypeError(f"state arrays must be float32 or float64, got {x.dtype}")
    return arrs


def lse_from_state(state):
    """log-sum-exp (natural log) of a state ``(m, l)``: ``m + log(l)``, for the running max and sum of
    Milakov & Gimelshein 2018, Algorithm 3.

    Args:
        state: a pair ``(m, l)`` as :func:`online_softmax_state` and :func:`merge_states` return: CuPy
            float32/float64 arrays of one shape, or real scalars (as in :func:`merge_states`).

    Returns:
        CuPy array of that shape, float64 if either input is float64, else float32: −inf for the empty state
        (−inf, 0), +inf when m = +inf, NaN for NaN.

    Raises:
        TypeError: not a pair; an entry that is neither a CuPy/CUDA array nor a real scalar (a NumPy array or a
            bool included); an array not float32/float64.
        ValueError: ``m`` and ``l`` of different shapes (no broadcasting).
    """
    import cupy

    m, l = _state_arrays(*_pair(state, "lse_from_state"))
    if m.shape != l.shape:
        raise ValueError(f"state arrays must have one shape, got m {m.shape} and l {l.shape}")
    return m + cupy.log(l)
