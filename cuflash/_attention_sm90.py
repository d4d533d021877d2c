"""Attention forward for Hopper (compute capability 9.0): warpgroup MMA (``wgmma.mma_async``, sm_90a).

After FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao 2024, arXiv:2407.08608): both GEMMs of
the FA-2 tile loop (Dao 2023, Algorithm 1) run as warpgroup MMAs with fp32 accumulators. A consumer warpgroup
owns 64 query rows; K/V tiles of ``Bc`` keys live in shared memory in the 128-byte-swizzled layout the wgmma
descriptors read; ``S = Q·Kᵀ`` takes Q and K from shared memory, ``O += P·V`` takes P from registers (the fp32
accumulator of S rounded to the input dtype is the A operand) and V from shared memory (transposed descriptor).

Variants (``variant=``; the default ``"auto"`` runs ``"tmap"``, ``"tma"`` for a tile only it has, ``pick_variant``):
``"tma"``: warp specialisation — a producer warpgroup whose one working thread
loads K/V tiles with the tensor memory accelerator (``cp.async.bulk.tensor`` through tensor maps built here with
the driver's ``cuTensorMapEncodeTiled``, 128-byte swizzle by the copy engine) into a 3-stage ring signalled on
mbarriers by transaction bytes (``setmaxnreg`` gives the producer's registers to the consumers), and two consumer
warpgroups that issue ``S_j`` together with ``P_{j-1}·V_{j-1}`` and run the softmax of ``S_j`` while the latter is
in flight (FA-3 intra-warpgroup pipelining), their wgmma issues alternated by named barriers (FA-3 ping-pong);
``"tmap"``: ``"tma"`` on a persistent grid (one block per SM, two with the Br = 64 tile; FA-3's persistent kernel
with its dynamic tile scheduler): each block's producer claims the next work tile (Q tile, head, batch; on a masked
problem longest first within groups of heads whose K and V fit ``LPT_GROUP_BYTES`` in L2, unmasked one head at a
time as the hardware starts the non-persistent grid's blocks) from a counter as its block frees up, loads that
tile's Q by TMA and keeps its K/V ring running across tiles, so the next tile's loads overlap the current tile's
last P·V and epilogue and the block start-up is paid once per SM; with the two ping-pong consumers or one
consumer its O leaves by TMA from the tile's last K buffer (``OSTAGE``; from registers with three);
``"ws"``: the same with every producer thread loading by cp.async (16-byte chunks written into the swizzled layout;
the fallback when K or V cannot be described by a tensor map: strides not multiples of 16 bytes, or no driver
entry point); ``"ws_nopp"``: ``"ws"`` without ping-pong; ``"simple"``: every thread loads, warpgroups in lockstep
(2 stages). Tiles (``TILES``): Br = 128, Bc = 128; at head_dim 64 with at most ``SHORT_SEQLEN_K`` keys (and fewer
than ``WIDE_SEQLEN`` queries or keys) the default is Br = 64 (``SHORT_TILES``: one consumer warpgroup, no ping-pong,
two blocks per SM so that one block's prologue and epilogue overlap the other's tile loop), and at head_dim 128 pv_n
= 128 (``"tmap"`` at every length; ``"tma"`` up to ``SHORT_SEQLEN_K`` keys, pv_n = 64 beyond). ``"tma"`` at head_dim
64 also instantiates Br = 192 with Bc = 128 and 64 (three consumer warpgroups without ping-pong, FA-3's head_dim 64
tile): Bc = 128 is the default from ``WIDE_SEQLEN`` queries and keys (``WIDE_TILES``), Bc = 64 a study tile
(``block_sizes=(192, 64)``). Masking, tails, GQA, lse and the bottom-right causal/window convention are those of
:mod:`cuflash.attention`; head_dim 64 and 128
natively (<= 64 padded to 64, 65..128 to 128). The kernels are in
``cuda_src/attention_fwd_sm90.cu``, the wgmma / mbarrier wrappers in ``cuda_src/cuflash/wgmma.cuh``, the TMA ones
in ``cuda_src/cuflash/tma.cuh``.

API (used by :func:`cuflash.attention` on cc 9.0 once validated): ``supports(p) -> bool`` and
``forward(p, block_sizes=None, return_lse=True, pv_n=None, variant=None) -> (out, lse)`` where ``p`` is an
:class:`cuflash._attn_common.AttnProblem`; ``self_check()`` launches every instantiation in parallel
subprocesses and reports hangs or crashes without taking the caller down.
"""
from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import _compile, _dtypes
from ._attn_common import last_axis_contiguous, pad_head_dim, parse_block_sizes

SOURCE = "attention_fwd_sm90.cu"
ARCH_OPTIONS = ("--gpu-architecture=sm_90a",)
LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 128)

# Kernel variants (cuda_src/attention_fwd_sm90.cu):
#   "ws"      version 4: producer warpgroup (cp.async ring, mbarriers, setmaxnreg) + 2 consumer warpgroups,
#             intra-warpgroup pipelining and ping-pong between the consumers (FA-3 §3.1-3.2);
#   "ws_nopp" version 4 without the ping-pong turns;
#   "simple"  version 3: every thread loads (cp.async, 2 stages, __syncthreads), warpgroups compute in lockstep.
#   "tma"     version 4 with the K/V loads by the tensor memory accelerator (one producer thread).
#   "tmap"    "tma" on a persistent grid (one block per SM, two at Br = 64) whose blocks claim their work tiles
#             from a counter (masked problems: longest first within groups of heads); the K/V ring runs on across
#             them, so the next tile's loads overlap the current tile's last P V and epilogue; O leaves by TMA
#             (OSTAGE; not the three-consumer tile). The default ("auto").
VARIANTS = ("tma", "tmap", "ws", "ws_nopp", "simple")
PERSISTENT = ("tmap",)
# "auto" (pick_variant): "tmap", or "tma" for a tile only it has (and where Q or O has no tensor map)
DEFAULT_VARIANT = os.environ.get("CUFLASH_SM90_VARIANT", "auto")
AUTO_VARIANTS = ("tma", "tmap")
WS_STAGES, WS_PRODUCER_REGS, WS_CONSUMER_REGS = 3, 56, 224
# Br = 64 (one consumer warpgroup, no ping-pong): two blocks per SM, 128 registers a thread at launch, moved from
# the producer (24) to the consumer (232) by setmaxnreg
WS1_PRODUCER_REGS, WS1_CONSUMER_REGS = 24, 232
# Br = 192 (three consumer warpgroups, no ping-pong; FA-3's head_dim 64 tile): one block of 512 threads per SM,
# 128 registers a thread at launch; setmaxnreg moves them from the producer (24) to the consumers (160):
# 128·24 + 384·160 = 64,512 <= 65,536 (with Bc = 64 or 128; Bc = 128 spilled 40 bytes at 160 at 04b3ec5, none since)
WS3_PRODUCER_REGS, WS3_CONSUMER_REGS = 24, 160
# setmaxnreg budgets (producer, consumer) per variant where they differ at Br = 128: the persistent loop's state
# needs more consumer registers (224 spilled at d128); its one TMA thread needs few. 128·24 + 256·240 = 168 per
# thread × 384.
REGS = {"tmap": (24, 240)}

# (Br, Bc, pv_n) per (variant, head_dim), default first. Br = 64 * consumer warpgroups; pv_n = N of each
# O += P·V wgmma: 64 (one 128-byte swizzle atom of V per wgmma) or head_dim (LBO = distance between the
# 64-column blocks of V).
TILES = {
    ("tma", 64): [(128, 128, 64), (64, 128, 64), (192, 64, 64), (192, 128, 64)],
    ("tma", 128): [(128, 128, 64), (128, 128, 128)],
    # persistent: at head_dim 64 the tiles of "tma" (Br = 64: two blocks per SM, each looping over work tiles); at
    # head_dim 128 pv_n = 128 first, the default at every length (logs/long_d128_rot_643a6f5: 1.02x / 1.10x tma's
    # same tile at 4K, 1.02-1.03x / 1.03-1.09x tma's pv_n = 64 at 8K-16K, non-causal / causal)
    ("tmap", 64): [(128, 128, 64), (64, 128, 64), (192, 128, 64)], ("tmap", 128): [(128, 128, 128), (128, 128, 64)],
    ("ws", 64): [(128, 128, 64)], ("ws", 128): [(128, 128, 64), (128, 128, 128)],
    ("ws_nopp", 64): [(128, 128, 64)], ("ws_nopp", 128): [(128, 128, 64)],
    ("simple", 64): [(128, 128, 64)],
    ("simple", 128): [(128, 128, 64), (128, 128, 128), (128, 64, 64)],
}


def kernel_name(dtype, head_dim: int, variant: str, Br: int, Bc: int, pv_n: int = 64) -> str:
    """C++ name expression of an instantiation."""
    ct = _dtypes.ctype(np.dtype(dtype))
    if variant == "simple":
        return f"cuflash::attention_fwd_sm90<{ct}, {head_dim}, {Br // 64}, {Bc}, {pv_n}>"
    pp = "true" if variant != "ws_nopp" and Br == 128 else "false"  # ping-pong: two consumer warpgroups
    tma = "true" if variant in ("tma", "tmap") else "false"
    persist = "true" if variant in PERSISTENT else "false"
    if Br == 64:
        preg, creg = WS1_PRODUCER_REGS, WS1_CONSUMER_REGS
    elif Br == 192:
        preg, creg = WS3_PRODUCER_REGS, WS3_CONSUMER_REGS
    else:
        preg, creg = REGS.get(variant, (WS_PRODUCER_REGS, WS_CONSUMER_REGS))
    return (f"cuflash::attention_fwd_sm90_ws<{ct}, {head_dim}, {Br // 64}, {Bc}, {pv_n}, {WS_STAGES}, {pp}, "
            f"{preg}, {creg}, {tma}, {persist}>")


# The 'tma' variant is compiled with -DCUFLASH_FWD_PIN=1: a shared-memory store of each tile's softmax result
# before the P V wait, so ptxas keeps the softmax overlapping that wgmma (see the kernel). CUFLASH_SM90_PIN=0 (or
# PIN_SOFTMAX = False) gives the unpinned order, for study; 'tmap' is pinned likewise, the other variants never.
PIN_SOFTMAX = os.environ.get("CUFLASH_SM90_PIN", "1") == "1"
PIN_OPTIONS = ARCH_OPTIONS + ("-DCUFLASH_FWD_PIN=1",)


PIN_VARIANTS = ("tma", "tmap")


# The persistent variant takes a masked problem's work tiles longest first within groups of heads whose K and V
# together fit LPT_GROUP_BYTES (sm90_work_tile: one head at a time, the last head's longest tiles start last; the
# group keeps the K and V the running blocks read within L2). 0: one head at a time (the order of the
# non-persistent grid). Unmasked problems, whose tiles are all alike, keep one head at a time, and so do problems
# of fewer than LPT_MIN_SEQLEN queries: rotated same-run A/B, causal, bfloat16 (logs/lpt_rot_ab_ee49e07.json):
# 1.03-1.05x from 2K (head_dim 64 and 128 where tmap runs), 1.02x / 1.00x at 1K (head_dim 64 / 128); at 512 the
# attention bench read 0.93x (its f48d085 run against 6e08925's).
LPT_GROUP_BYTES = 16 << 20
LPT_MIN_SEQLEN = 2048


def group_heads(p, d: int) -> int:
    """Heads per longest-first group of the persistent variant's work list (see LPT_GROUP_BYTES)."""
    left, right = p.window
    if not LPT_GROUP_BYTES or (left < 0 and right < 0) or p.seqlen_q < LPT_MIN_SEQLEN:
        return 1
    kv = max(1, 2 * p.seqlen_k * d * np.dtype(p.dtype).itemsize // p.group)  # K and V bytes per query head
    n_q = -(-p.seqlen_q // 64)  # (at least the Q tiles of any Br; the kernel's group index math is 32-bit)
    return int(max(1, min(p.batch * p.heads_q, LPT_GROUP_BYTES // kv, (2**31 - 1) // max(1, n_q))))


# The persistent kernel with ping-pong or one consumer stores O by the tensor memory accelerator from shared memory
# (the kernel's CUFLASH_FWD_OSTAGE); OSTAGE = 0 compiles its earlier 4-byte stores from registers, for study (same
# output bits; 1.03-1.10x slower at head_dim 128 1K-4K, logs/ostage_rot_ab_602bd5e.json; 1.02-1.03x with the
# Br = 64 tile at head_dim 64 512, logs/ostage64_rot_ab_9426b05.json).
OSTAGE = 1
# The persistent kernel loads and releases the Q tile per consumer, each its 64 rows (the kernel's
# CUFLASH_FWD_QSPLIT): a consumer's next Q loads once its own last S has read its rows and the parts before it are
# released (the producer publishes them in order). QSPLIT = 0 loads the whole tile once every consumer's last S has,
# for study (the same output bits; rotated A/B, logs/qsplit_rot_ab_*_ebe65aa: the split 1.01x at head_dim 64 causal
# 1K-4K, 0.997-1.002x elsewhere).
QSPLIT = 1
# where the persistent consumer releases the previous work tile's O stage (CUFLASH_FWD_OREL_LATE): 1 after the
# next tile's first S is issued, 0 before it, for study (the same output bits; rotated A/B,
# logs/orel_rot_ab_*_344a9e4.json: 1 is 1.004-1.018x over 0 at head_dim 128 1K-4K, 0.99x on one row of 12).
OREL_LATE = 1


def compile_options(variant: str) -> tuple[str, ...]:
    """The NVRTC options a variant is launched with (pinned 'tma' / 'tmap' while PIN_SOFTMAX is on; the
    persistent kernel's study knobs OSTAGE, QSPLIT, OREL_LATE)."""
    opts = PIN_OPTIONS if (PIN_SOFTMAX and variant in PIN_VARIANTS) else ARCH_OPTIONS
    if variant not in PERSISTENT:
        return opts
    if OREL_LATE not in (0, 1):
        raise ValueError(f"OREL_LATE must be 0 or 1, not {OREL_LATE!r}")
    return (opts + (() if OSTAGE else ("-DCUFLASH_FWD_OSTAGE=0",)) + (() if QSPLIT else ("-DCUFLASH_FWD_QSPLIT=0",))
            + (() if OREL_LATE == 1 else (f"-DCUFLASH_FWD_OREL_LATE={int(OREL_LATE)}",)))


def smem_bytes(variant: str, head_dim: int, Br: int, Bc: int, pin: bool = False) -> int:
    """Q tile + the K and V stages (16-bit) + 1024 bytes to align the swizzle atoms (+ the mbarriers, + a 4-byte
    slot per consumer warp when ``pin``)."""
    if variant == "simple":
        return 2 * head_dim * (Br + 4 * Bc) + 1024
    # the persistent kernel's Q full / empty pair and work-tile slot per Q part: per consumer, or one (QSPLIT = 0)
    q_bars = 24 * (Br // 64 if QSPLIT else 1) if variant in PERSISTENT else 0
    return (2 * head_dim * (Br + 2 * WS_STAGES * Bc) + 1024 + 16 * WS_STAGES + q_bars
            + (16 * (Br // 64) if pin else 0))


def threads(variant: str, Br: int) -> int:
    return Br // 64 * 128 + (0 if variant == "simple" else 128)


def configurations():
    """Every (dtype, head_dim, variant, Br, Bc, pv_n) instantiated."""
    return [(dt, d, var, br, bc, pv) for dt in (_dtypes.float16, _dtypes.bfloat16) for var in VARIANTS
            for d in HEAD_DIMS for (br, bc, pv) in TILES[(var, d)]]


def _declare():
    for (dt, d, var, br, bc, pv) in configurations():
        name = kernel_name(dt, d, var, br, bc, pv)
        if var in PIN_VARIANTS:  # pinned (the default) and unpinned (PIN_SOFTMAX = False, study)
            _compile.declare(SOURCE, [name], extra_options=PIN_OPTIONS)
            _compile.declare(SOURCE, [name], extra_options=ARCH_OPTIONS, release=False)
        else:
            _compile.declare(SOURCE, [name], extra_options=ARCH_OPTIONS)


_declare()


_CC: dict = {}
_CARVED: set = set()  # kernels whose preferred shared-memory carveout is set (once each)


def _device_cc(p) -> str:
    dev = p.q.device.id
    cc = _CC.get(dev)
    if cc is None:
        import cupy

        cc = _CC[dev] = cupy.cuda.Device(dev).compute_capability
    return cc


def supports(p) -> bool:
    """True when this kernel can run problem ``p``: float16/bfloat16, head_dim <= 128 (64 and 128 natively,
    smaller ones zero-padded to 64, 65..127 to 128), on a device of compute capability 9.0."""
    if p.dtype not in (np.dtype(_dtypes.float16), np.dtype(_dtypes.bfloat16)):
        return False
    if p.head_dim > 128:
        return False
    try:
        return _device_cc(p) == "90"
    except Exception:  # pragma: no cover - no device
        return False


def kernel_head_dim(head_dim: int) -> int:
    """The native head_dim the kernel runs for a caller's head_dim (<= 128)."""
    if head_dim <= 64:
        return 64
    if head_dim <= 128:
        return 128
    raise ValueError(f"the sm90 attention kernel supports head_dim <= 128, got {head_dim}")


# Short key sequences: blocks of few K/V tiles are bound by their prologue (Q load, first tile) and epilogue, which
# two blocks per SM overlap. Measured on the H200 (experiments/results/logs/sm90_br64_ab_529c3fa.json, head_dim 64,
# both dtypes, same run): Br = 64 is 0-10 % faster (4 % on average) than Br = 128 for seqlen 512-4K (causal
# or not), 4-6 % slower at 16K. At head_dim 128 the Br = 128 tile with one P·V wgmma over the whole head_dim
# (pv_n = 128) is, in "tma", 1-2 % faster than pv_n = 64 at 512-4K, causal or not, and 6-7 % slower at 16K ("tmap"
# runs pv_n = 128 at every length, TILES); a Br = 64,
# Bc = 64 two-stage tile (two blocks per SM) was up to 32 % slower (equal only at 512 causal)
# (experiments/results/logs/sm90_d128_ab_ebe4978.json, bfloat16, same run).
SHORT_SEQLEN_K = 4096
SHORT_TILES = {("tma", 64): (64, 128, 64), ("tma", 128): (128, 128, 128),
               ("tmap", 64): (64, 128, 64), ("tmap", 128): (128, 128, 128)}


# Wide Q tiles at head_dim 64: the Br = 192, Bc = 128 tile (three consumer warpgroups, FA-3's head_dim 64 tile) from
# WIDE_SEQLEN queries and keys, causal or not. Measured on the H200 in same-run A/Bs, both dtypes: against the
# previous defaults (Br = 64 up to 4K keys, Br = 128 beyond, Br = 192 / Bc = 64 from 8K unmasked keys), before the
# per-warpgroup tile skip, 1.00-1.19x at 2K-16K (experiments/results/logs/fwd_192x128_ab_*_701c241.json); the skip
# then 1.00-1.18x (own_tiles_{tree,here}_*.json, 97114c4); against the Br = 64 tile at 1K 1.05x (non-causal) and
# 1.02x (causal), at 1.5K-2K 1.09-1.12x (logs/fwd_wide_ab_*_efc561b.json; 512-768 keep SHORT_TILES). Both lengths
# are asked for: a few queries against many keys would leave most of the three warpgroups' rows empty (not
# measured; the shorter tiles stay there).
WIDE_SEQLEN = 1024
WIDE_TILES = {("tma", 64): (192, 128, 64), ("tmap", 64): (192, 128, 64)}


def default_tile(variant: str, head_dim: int, seqlen_q: int, seqlen_k: int) -> tuple[int, int, int]:
    """The (Br, Bc, pv_n) a call without ``block_sizes`` runs: WIDE_TILES from WIDE_SEQLEN queries and keys,
    SHORT_TILES up to SHORT_SEQLEN_K keys, else the first of TILES."""
    wide = WIDE_TILES.get((variant, head_dim))
    if wide is not None and min(seqlen_q, seqlen_k) >= WIDE_SEQLEN:
        return wide
    short = SHORT_TILES.get((variant, head_dim))
    if short is not None and seqlen_k <= SHORT_SEQLEN_K:
        return short
    return TILES[(variant, head_dim)][0]


# "auto": the persistent variant with its dynamic tile scheduler, at every shape. Rotated same-run A/Bs on the
# H200, bfloat16, 16K tokens, against "tma": head_dim 64 1.02-1.12x from 1K to 8K, 0.99x / 1.02x at 16K
# (non-causal / causal; experiments/results/logs/tmap_rot_ab_*_b9634ea.json, the same tiles, before OSTAGE, which
# does not touch those tiles); head_dim 128, with OSTAGE, 1.02-1.12x at 1K-4K (ostage_rot_ab_602bd5e.json, the
# same tiles) and 1.02-1.10x at 4K-16K (long_d128_rot_643a6f5.json, tmap's pv_n = 128 against tma's default).
# "tma" when the requested tile is not one of tmap's, or (forward) when Q or O cannot be described by a tensor map.
def pick_variant(variant, head_dim: int, block_sizes=None, pv_n=None) -> str:
    """The concrete variant a call runs: ``variant`` (None: ``DEFAULT_VARIANT``) as given, or for ``"auto"``
    ``"tmap"``, and ``"tma"`` when the requested tile is not one of ``"tmap"``'s. Raises ValueError for an unknown
    name."""
    var = DEFAULT_VARIANT if variant is None else str(variant)
    if var == "auto":
        d = kernel_head_dim(head_dim)
        var = "tmap"
        if block_sizes is not None:
            br, bc = parse_block_sizes(block_sizes)
            if not any(c[:2] == (br, bc) and (pv_n is None or c[2] == int(pv_n)) for c in TILES[("tmap", d)]):
                var = "tma"
    if var not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {VARIANTS}, got {variant!r}")
    return var


def default_variants() -> tuple[str, ...]:
    """The concrete variants the default (``DEFAULT_VARIANT``) runs: ``AUTO_VARIANTS`` for "auto"."""
    return AUTO_VARIANTS if DEFAULT_VARIANT == "auto" else (DEFAULT_VARIANT,)


def choose(p, block_sizes=None, pv_n=None, variant=None) -> tuple[str, int, int, int]:
    """(variant, Br, Bc, pv_n) for problem ``p`` (its head_dim, seqlen_q and seqlen_k); validates the choices
    against the instantiated set."""
    d = kernel_head_dim(p.head_dim)
    var = pick_variant(variant, p.head_dim, block_sizes, pv_n)
    avail = TILES[(var, d)]
    if block_sizes is None:
        br, bc, pv0 = default_tile(var, d, p.seqlen_q, p.seqlen_k)
    else:
        br, bc = parse_block_sizes(block_sizes)
        pv0 = next((c[2] for c in avail if c[:2] == (br, bc)), None)
        if pv0 is None:
            raise ValueError(f"block_sizes (Br={br}, Bc={bc}) is not instantiated for the sm90 kernel "
                             f"({var}, head_dim {d}); available (Br, Bc, pv_n): {avail}")
    pv = pv0 if pv_n is None else int(pv_n)
    if (br, bc, pv) not in avail:
        raise ValueError(f"pv_n={pv} is not instantiated for (Br={br}, Bc={bc}), {var}, head_dim {d}; "
                         f"available (Br, Bc, pv_n): {avail}")
    return var, br, bc, pv


# ---- tensor maps (the TMA variant) ------------------------------------------------------------------------
# CUtensorMap: 128 opaque bytes, passed by value as a __grid_constant__ kernel parameter (CuPy passes a numpy
# array of size one by value). Enum values from cuda.h (CUtensorMapDataType, ...Swizzle, ...L2promotion).
_MAP_DTYPE = np.dtype([("opaque", "<u8", (16,))])
_ZERO_MAP = np.zeros(1, dtype=_MAP_DTYPE)
_CU_DTYPE = {"float16": 6, "bfloat16": 9}
_SWIZZLE_128B, _L2_PROMOTION_256B = 3, 3


@functools.lru_cache(maxsize=None)
def _encode_fn():
    """The driver's cuTensorMapEncodeTiled through ctypes (None when the driver library lacks it)."""
    import ctypes

    try:
        fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    except (OSError, AttributeError):
        return None
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def tensor_map(a, box_rows: int):
    """The TMA tensor map of a (batch, heads, seqlen, head_dim) 16-bit array with a contiguous last axis: a 4-D
    tiled map (head_dim, seqlen, heads, batch) with boxes of 64 x ``box_rows`` elements (128-byte rows, 128-byte
    swizzle, out-of-bounds rows read as zeros), as a size-one numpy array for the kernel launch.

    Returns None when the array cannot be described (data not 16-byte aligned, a stride not a multiple of 16
    bytes or beyond 2^40, or no cuTensorMapEncodeTiled in the driver); the caller then loads with cp.async.
    A map only describes an address range, so maps are cached by (pointer, dtype, shape, strides, box): repeated
    calls on the same buffers skip the driver call.
    """
    if a.ndim != 4 or a.strides[3] != a.itemsize or a.data.ptr % 16:
        return None
    return _tensor_map(a.data.ptr, a.dtype.name, a.shape, a.strides, int(box_rows))


@functools.lru_cache(maxsize=256)
def _tensor_map(ptr, dtype_name, shape, strides_bytes, box_rows):
    import ctypes

    fn = _encode_fn()
    if fn is None or dtype_name not in _CU_DTYPE:
        return None
    B, H, S, d = shape
    dims, strides = [d, S, H, B], []
    prev = d * 2  # 16-bit elements
    for size, stride in ((S, strides_bytes[2]), (H, strides_bytes[1]), (B, strides_bytes[0])):
        if size == 1:  # any stride reads the same element: give a valid one
            stride = prev
        if stride <= 0 or stride % 16 or stride >= 1 << 40:
            return None
        strides.append(stride)
        prev = stride * size
    out = np.zeros(1, dtype=_MAP_DTYPE)
    c64, c32 = ctypes.c_uint64, ctypes.c_uint32
    rc = fn(out.ctypes.data, _CU_DTYPE[dtype_name], 4, ptr, (c64 * 4)(*dims), (c64 * 3)(*strides),
            (c32 * 4)(64, box_rows, 1, 1), (c32 * 4)(1, 1, 1, 1), 0, _SWIZZLE_128B, _L2_PROMOTION_256B, 0)
    return out if rc == 0 else None  # (shared by the calls that hit the cache; nothing writes it)


def forward(p, block_sizes=None, return_lse=True, pv_n=None, variant=None):
    """Run the sm90 kernel on a prepared :class:`AttnProblem` ``p``.

    ``variant``: "auto" (default, or $CUFLASH_SM90_VARIANT: "tmap", or "tma" for its own tiles, ``pick_variant``),
    "tma", "tmap", "ws", "ws_nopp" or "simple" (see VARIANTS; "auto" falls back to "tma" with the same tile when
    only Q or O cannot be described by a tensor map and to "ws" when K or V cannot, an explicit "tma"/"tmap"
    raises);
    ``block_sizes`` (Br, Bc) and ``pv_n`` pick an instantiated tile configuration of that variant.
    Returns ``(out, lse)``: out (batch, heads_q, seqlen_q, head_dim), contiguous, q's dtype; lse float32
    (batch, heads_q, seqlen_q), natural-log logsumexp of the scaled masked scores, -inf (and out 0) for a row
    that sees no key. ``lse`` is computed in any case (``return_lse`` is accepted for the common signature).
    Raises TypeError for float32 input, ValueError for head_dim > 128 or a configuration not instantiated (also
    when K or V need the cp.async fallback and ``block_sizes`` names a tile that only the TMA producer
    instantiates), ConfigurationError when the shared memory does not fit the device.
    """
    import cupy

    if p.dtype not in (np.dtype(_dtypes.float16), np.dtype(_dtypes.bfloat16)):
        raise TypeError(f"the sm90 attention kernel takes float16 or bfloat16, got {p.dtype}")
    d = kernel_head_dim(p.head_dim)
    var, br, bc, pv = choose(p, block_sizes, pv_n, variant)
    B, Hq, Sq, Sk = p.batch, p.heads_q, p.seqlen_q, p.seqlen_k
    dt = p.dtype
    out = cupy.empty((B, Hq, Sq, d), dtype=dt)
    lse = cupy.empty((B, Hq, Sq), dtype=np.float32)
    if B == 0 or Hq == 0 or Sq == 0:
        return cupy.ascontiguousarray(out[..., :p.head_dim]), lse
    if d != p.head_dim:
        qq, kk, vv = (pad_head_dim(a, d) for a in (p.q, p.k, p.v))
    else:
        qq, kk, vv = (last_axis_contiguous(a) for a in (p.q, p.k, p.v))
    scale = float(p.softmax_scale)
    if not scale > 0:  # the kernels fold a positive scale into the exponent: move the sign into q
        if scale < 0:
            qq = (qq.view(cupy.uint16) ^ cupy.uint16(0x8000)).view(dt)  # -q, exactly
            scale = -scale
        else:  # scale 0: every visible score is 0, but NaN / inf in q or k still make it NaN (0 * inf), as
            # (q @ k.T) * 0 does: q's finite entries become 0, its non-finite ones stay (exponent bits all ones)
            b = qq.view(cupy.uint16)
            e = cupy.uint16(0x7C00 if dt == np.float16 else 0x7F80)
            qq, scale = cupy.where((b & e) == e, b, cupy.uint16(0)).view(dt), 1.0
    it = np.dtype(dt).itemsize

    def st(a):
        s = a.strides
        return [np.int64(s[0] // it), np.int64(s[1] // it), np.int64(s[2] // it)]

    left, right = p.window
    args = (qq, kk, vv, out, lse, *st(qq), *st(kk), *st(vv), *st(out),
            np.int32(Hq), np.int32(p.group), np.int32(Sq), np.int32(Sk),
            np.float32(scale * LOG2E), np.int32(left), np.int32(right))
    if var != "simple":
        maps = None
        if var in ("tma", "tmap"):
            explicit = variant not in (None, "auto")
            kmap = tensor_map(kk, bc) if Sk else _ZERO_MAP  # no key: no K/V tile is ever loaded
            vmap = tensor_map(vv, bc) if Sk else _ZERO_MAP
            qmap = tensor_map(qq, 64) if var in PERSISTENT else _ZERO_MAP  # the persistent producer loads Q too
            omap = tensor_map(out, 64) if var in PERSISTENT else _ZERO_MAP  # ... and stores O (64-row boxes)
            if (qmap is None or omap is None) and kmap is not None and vmap is not None and not explicit:
                var, qmap, omap = "tma", _ZERO_MAP, _ZERO_MAP  # not describable: the same tile, non-persistent
            maps = (kmap, vmap, qmap, omap)
            if any(m is None for m in maps):  # not describable by a tensor map: the cp.async producer
                if explicit:
                    raise ValueError(f"variant {var!r} needs K and V (and Q and O for {PERSISTENT}) with 16-byte "
                                     "aligned data and strides that are multiples of 16 bytes (and the driver's "
                                     "cuTensorMapEncodeTiled)")
                var, maps = "ws", None
                if block_sizes is None:  # the cp.async producer's own default tile
                    br, bc, pv = default_tile(var, d, Sq, Sk)
                elif (br, bc, pv) not in TILES[(var, d)]:  # a tile only the TMA producer instantiates
                    raise ValueError(f"block_sizes (Br={br}, Bc={bc}) is a tile of the TMA variant only, and K or V "
                                     "cannot be described by a tensor map (data not 16-byte aligned, or a zero, "
                                     "negative or non-16-byte-multiple stride); the cp.async producer has "
                                     f"{TILES[(var, d)]}")
        # the persistent grid's work counters (per stream; every launch leaves them zero)
        sched = _compile.stream_counters(p.q.device.id) if var in PERSISTENT else np.uintp(0)
        grp = group_heads(p, d) if var in PERSISTENT else 1
        args = args + (maps if maps is not None else (_ZERO_MAP,) * 4) + (sched, np.int32(B), np.int32(grp))
    opts = compile_options(var)
    pin = "-DCUFLASH_FWD_PIN=1" in opts
    kern = _compile.get_kernel(SOURCE, kernel_name(dt, d, var, br, bc, pv), opts)
    if br == 64 and kern not in _CARVED:  # two blocks per SM: all of the unified L1 as shared memory
        kern.preferred_shared_memory_carveout = 100
        _CARVED.add(kern)
    if var in PERSISTENT:  # one block per SM (two at Br = 64), each loops over the Q tiles
        per_sm = 2 if br == 64 else 1
        grid = (min(math.ceil(Sq / br) * Hq * B, per_sm * _compile.sm_count(p.q.device.id)), 1, 1)
    else:
        grid = (math.ceil(Sq / br), Hq, B)
    _compile.launch(kern, grid, (threads(var, br),), args, shared_mem=smem_bytes(var, d, br, bc, pin),
                    what=lambda: f"attention sm90 {var} (Br={br}, Bc={bc}, pv_n={pv}, head_dim={d}, {dt})")
    if d != p.head_dim:
        out = cupy.ascontiguousarray(out[..., :p.head_dim])
    return out, lse


def flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal=False) -> float:
    """Forward FLOPs by the FlashAttention convention: 4·B·H·Sq·Sk·d, halved when causal."""
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return f / 2 if causal else f


# ----------------------------------------------------------------------------------------------------------
# Self-check: each instantiation compiled and launched in its own subprocess (all in parallel), so that a
# kernel that hangs (a barrier deadlock) or crashes (an illegal address poisons the CUDA context) is found
# without taking the calling process down. Also fills CuPy's on-disk kernel cache.
_CHECK_SCRIPT = r"""
import sys
import numpy as np, cupy as cp
from cuflash import _attention_sm90 as S, _dtypes
from cuflash._attn_common import prepare
dt = {"float16": np.float16, "bfloat16": _dtypes.bfloat16}[sys.argv[1]]
d, var, br, bc, pv = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng = np.random.default_rng(0)
def r(*shape):
    return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dt)
for sq, sk, causal, win, hq, hkv in [(1, 1, False, (-1, -1), 1, 1), (300, 517, True, (-1, -1), 4, 2),
                                     (700, 130, False, (0, 0), 2, 2), (257, 1000, False, (77, 13), 2, 1),
                                     (1024, 1024, True, (-1, -1), 2, 2), (64, 0, False, (-1, -1), 1, 1)]:
    p = prepare(r(1, hq, sq, d), r(1, hkv, sk, d), r(1, hkv, sk, d), causal=causal, window_size=win)
    o, l = S.forward(p, (br, bc), pv_n=pv, variant=var)
    cp.cuda.runtime.deviceSynchronize()
    assert not bool(cp.isnan(o.astype(cp.float32)).any()), ("NaN", sq, sk, causal, win)
print("SELF_CHECK_OK")
"""


def config_key(dtype, head_dim, variant, Br, Bc, pv_n):
    return (np.dtype(dtype).name, int(head_dim), str(variant), int(Br), int(Bc), int(pv_n))


def self_check(configs=None, timeout: float | None = None) -> dict:
    """Launch each configuration (default: all) on a few shapes in subprocesses, $CUFLASH_SM90_CHECK_JOBS
    (default 4) at a time.

    Returns {config_key: None when it ran, else the failure text (crash output, or a timeout = hang)}.
    ``timeout`` (seconds, for each wave of subprocesses) defaults to $CUFLASH_SM90_CHECK_TIMEOUT or 240. (It was
    once a budget for all waves together: with more configurations and a loaded machine (16 test workers
    compiling) the last waves ran out of it and healthy kernels were reported as hangs.)
    """
    timeout = float(os.environ.get("CUFLASH_SM90_CHECK_TIMEOUT", "240") if timeout is None else timeout)
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    jobs = int(os.environ.get("CUFLASH_SM90_CHECK_JOBS", "4"))  # each subprocess holds a CUDA context
    keys = [config_key(*cfg) for cfg in (configurations() if configs is None else configs)]
    res = {}
    for w in range(0, len(keys), jobs):  # waves of `jobs` subprocesses, each with its own time limit
        procs, t0 = {}, time.time()
        for key in keys[w:w + jobs]:
            args = [sys.executable, "-c", _CHECK_SCRIPT, key[0], *(str(x) for x in key[1:])]
            procs[key] = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)
        for key, pr in procs.items():
            try:
                out, _ = pr.communicate(timeout=max(1.0, timeout - (time.time() - t0)))
                ok = pr.returncode == 0 and "SELF_CHECK_OK" in out
                res[key] = None if ok else f"self-check failed (rc {pr.returncode}): {out[-1500:]}"
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.communicate()
                res[key] = f"self-check timed out after {timeout:.0f} s (a hang: barrier deadlock?)"
    return res
