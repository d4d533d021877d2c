"""LayerNorm and RMSNorm on CuPy arrays: float32 statistics, fused residual add, forward and backward.

Normalisation is memory-bound, so each kernel makes one pass over HBM per row: the row (``h = x`` or
``h = x + residual``) is loaded once, kept on chip (registers, then shared memory; re-read from L2 only for
rows beyond ~100K elements), reduced to its statistics and written once; the weights (backward: also the
dweight/dbias partial sums) stay in registers across the rows a thread handles, as far as registers allow
(``HOLD``). The statistics are float32 whatever the input dtype, never E[x^2] - E[x]^2: LayerNorm rows held
entirely on chip (registers, shared memory, or the streamed kernel's stages) take the exact two-pass formula
(the mean from one block sum, then the sum of squared deviations from it over the same on-chip row); longer rows
use Welford's running (count, mean, M2) merged across lanes, warps and blocks with Chan, Golub & LeVeque's
pairwise formula; RMSNorm accumulates x^2 in float32 (float16 x^2 overflows above |x| ~ 256). On compute
capability 9.0, RMSNorm rows (but float32 rows without residual that ``norm_fwd`` holds whole in registers, up to
8K) and fused LayerNorm rows of 2048 to 8192 whole 16-byte vectors are split over a thread-block cluster
(``norm_fwd_cluster``): each block's share in registers, the blocks' states (LayerNorm: mean and M2 of the share,
two-pass within each warp, Chan-merged) exchanged through distributed shared memory; so are
plain LayerNorm's float32 rows of 32K, on persistent clusters that hold each block's weight and bias in shared memory,
and plain LayerNorm rows without weight and bias over up to four blocks.

- LayerNorm: Ba, Kiros & Hinton, "Layer Normalization" (2016): ``y = (h - mean) / sqrt(var + eps) * w + b``
  with the biased variance, as ``torch.nn.functional.layer_norm``.
- RMSNorm: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019): ``y = h / sqrt(mean(h^2) + eps) * w``,
  as ``torch.nn.functional.rms_norm``: ``eps=None`` means ``finfo(float32).eps`` (1.19e-7) for every input dtype,
  the epsilon of the float32 statistics, as torch computes it since 2.6 (torch's ``toOpMathType``; measured against
  torch 2.11 on the H200, ``experiments/scratch/newuser_probe.py``). For 16-bit inputs it is not
  ``finfo(x.dtype).eps`` (bfloat16 7.8e-3, float16 9.8e-4), which changed rows of mean square 1e-4 by up to 9x.

Subnormal numbers: CuPy compiles every kernel with ``-ftz=true``, so float32 squares below 1.2e-38 (float32's
smallest normal) flush to zero. Against any ``eps`` above ~1e-30 that is negligible, but with ``eps=0`` a row whose
values (LayerNorm: deviations from the mean) are all below ~1e-19 has a zero variance and gives inf/NaN where a
float64 reference (or torch, which keeps subnormals) gives finite values.

Kernels: ``cuda_src/norm.cu`` (``norm_fwd``, ``norm_fwd_stream``, ``norm_fwd_cluster``, ``norm_bwd``,
``norm_bwd_stream``, ``norm_bwd_cluster``, ``reduce_parts``), ``cuda_src/cuflash/welford.cuh`` and
``cuda_src/cuflash/cluster.cuh``.
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from . import _compile, _dtypes
from ._attn_common import aligned_contiguous as _aligned, as_bool, as_cupy, as_float, as_int

__all__ = ["layer_norm", "rms_norm", "layer_norm_backward", "rms_norm_backward"]

_SRC = "norm.cu"
LAYER, RMS = 0, 1
NV = 4          # 16-byte vectors per thread kept in registers (norm_fwd / norm_bwd template argument)
NV_WARP_BYTES = 96  # bytes per lane on the forward's warp-per-row path: rows of up to 3 KiB (768 float32 values;
                   # 16-bit rows take at most 64 bytes a lane, up to 1024 values: 2048 would spill). float32 1K rows
                   # (4 KiB, 8 vectors a lane at 128) run faster as blocks of 64 threads, four vectors each: H200,
                   # same run against 128 (experiments/results/norm_short_ab_522f164.json): LayerNorm 0.977 -> 0.994
                   # of a copy of x, RMSNorm 0.976 -> 0.990, with residual 0.991 -> 1.004 / 0.981 -> 0.996, level
                   # with the Triton peer (0.99); 512-768 within 0.5 %. 768 as blocks lost (LayerNorm -1.3 %, with
                   # residual -5 %; norm_short_ab_91d2ded.json)
WARP_ROWS = 1   # rows (warps) per block on the forward's warp-per-row path (at most 8). 1 (32 threads): float32
                # 1K LayerNorm / RMSNorm 0.98 / 0.98 of copy against 0.95 / 0.96 with 2, bfloat16 RMSNorm 1K 0.96
                # against 0.95, the other 1K rows even (norm_tune at e63c7f7, experiments/results/
                # norm_tune_1k_e63c7f7.json); 2 had beaten 8 (bf16 LayerNorm 1K 0.88 against 0.81, f48e99e)
WARP_RMS16 = False  # 16-bit RMSNorm rows without residual take the warp-per-row path where it applies (True, as
                    # before); False: the block path (one row a block of G >= 32 threads, launch bounds of 64 registers
                    # against the warp kernel's 80: 32 one-warp blocks an SM instead of 25). H200, same run
                    # (experiments/results/norm_short_ab_4d231be.json): bfloat16 1K 0.975 -> 0.994 of a copy of x
                    # (Triton 0.988), 512 0.758 -> 0.787 (Triton 0.787); float32 RMSNorm and 16-bit LayerNorm gained
                    # nothing from it, with residual even (norm_short_ab_91d2ded.json). Measured with weights of x's
                    # dtype only; the rule covers float32 weights and every device too
RMS_DEFAULT_EPS = float(np.finfo(np.float32).eps)  # rms_norm's eps=None (torch >= 2.6: float32's, any dtype)
FWD_WAVES = 0   # > 0: cap the forward grid at FWD_WAVES x resident blocks (grid-stride); 0: a group per row
STREAM = True   # forward rows of whole 16-byte vectors through norm_fwd_stream (cp.async staging) where they fit
STREAM_MIN_VECS = 4096       # streamed only rows of at least this many 16-byte vectors (64 KiB; shorter rows ran
                             # as fast or faster from registers on the H200: experiments/norm_tune.py; again
                             # with the row ticket, 2026-12-01: plain LayerNorm bf16 16K 0.855 -> 0.710 of copy,
                             # float32 8K 0.940 -> 0.870, bf16 8K 0.903 -> 0.777, logs/norm_streammin_ab_e9d009d.json)
STREAM_WARP_MAX_VECS = 256   # rows of at most this many 16-byte vectors: a warp per row (4 KiB rows)
STREAM_VECS_PER_THREAD = 4   # block path: threads per row = vectors / this (at most MAX_THREADS)
STREAM_STAGES = 2            # block path: rows staged in shared memory (this one and the next one; 3: the next
                             # two where three fit, else 2). Three gained 1-2 % before the row ticket (e1f56d8);
                             # with it two lead by 1.4-2.4 % (bf16 32K 0.864 -> 0.877 of copy, float32 16K 0.873 ->
                             # 0.886, six runs, logs/ln_issue_branchfree_*_facc1d9.json), and with the copies
                             # through L1 by 6-7 % (16-bit 32K 0.86 -> 0.92; float32 16K even, 0.93;
                             # logs/ln_ca_*_facc1d9.json)
STREAM_TICKET = True         # norm_fwd_stream's blocks claim their rows from a counter as they go (per device and
                             # stream, reset by the last block out); False: a fixed share, grid-stride. With the
                             # fixed share the blocks of float32 LayerNorm 16K (31 rows each) ended 106-144 us in,
                             # the SMs stream at different rates; with the ticket 130-136 us, launch 151 -> 145 us
                             # (+4 %; bfloat16 32K even; experiments/results/norm_timeline_probe_1de0a7f.json)
FWD_CLUSTER_SIZES = (2, 4, 8)  # compute capability >= 9.0: forward rows of whole 16-byte vectors, at least
                               # FWD_CLUSTER_MIN_VECS of them, split over a thread-block cluster (norm_fwd_cluster),
                               # the smallest size that leaves each block at most 4 * FWD_CLUSTER_MAX_THREADS
                               # vectors (four a thread, in registers); () turns the path off
FWD_CLUSTER_MIN_VECS = 2048    # rows of at least this many vectors (float32 8K, 16-bit 16K)
FWD_CLUSTER_MAX_THREADS = 256  # threads per block of norm_fwd_cluster (its launch bounds' limit)
FWD_CLUSTER_HOLD = False  # norm_fwd_cluster persistent (as many clusters as fit, rows cluster-stride), each
                          # thread's weight/bias vectors kept in shared memory instead of re-read per row from L2,
                          # for every row without residual (study setting: RMSNorm lost with it, float32 8K-32K
                          # 0.87-0.89 of copy against 0.92-0.95; logs/norm_sweep_hold_d562161.json against
                          # logs/norm_sweep_d562161.json)
FWD_CLUSTER_PREFETCH = 0  # > 0: the held form loads each block's share of its next row while this one is reduced
                          # and written (a second register buffer), with LayerNorm's launch bounds at this many
                          # blocks an SM (2: no spills, 3: a few words spilled; RMSNorm's stay 4). Study setting,
                          # wip/norm-hold-prefetch: not yet run on a GPU
PREFETCH_BLOCKS = {LAYER: (2, 3), RMS: (4,)}  # the instantiated launch bounds of the prefetching kernels
FWD_CLUSTER_PLAIN_LAYER = False  # LayerNorm without a residual takes the cluster path at every length. Off: it ran
                                 # slower there than on norm_fwd / norm_fwd_stream (float32 8K-32K 0.73-0.86 of copy
                                 # against 0.74-0.93, bf16 16K-32K 0.65-0.72 against 0.69-0.83;
                                 # logs/norm_sweep_3a64b22.json, norm_sweep_nocluster_3a64b22.json) ...
FWD_CLUSTER_LAYER_NO_AFFINE = 4  # LayerNorm without residual, weight or bias takes the cluster path when the row
                                 # needs at most this many blocks (5 an SM there; 0: never). H200, same run against
                                 # its other paths (logs/ln_affine_probe_occ*_96865ef.json): bf16 16K 0.90 vs
                                 # 0.88 of copy, 32K 0.84 vs 0.80, float32 8K 0.98 vs 0.97, 16K 0.98 vs 0.86; with
                                 # weight and bias it trails there (bf16 16K 0.74 vs 0.85), as it does at 8 blocks
                                 # (bf16 64K 0.75 vs 0.82). Staging those weights in shared memory by cp.async
                                 # behind the row's loads did not close it (bf16 16K 0.74, 32K 0.62 vs 0.71;
                                 # experiments/results/ln_stagew_probe*.json, 266b6e8): removed
FWD_CLUSTER_LAYER_AFFINE = 0  # LayerNorm without residual but with weight and/or bias of x's dtype (staged in
                              # shared memory per row) takes the cluster path when the row needs at most this many
                              # blocks (0: never). With the cluster kernel's output loop specialised per presence of
                              # weight and bias (20b5a00) it led at 2 blocks (bf16 16K 0.878 vs 0.856 of copy,
                              # logs/ln_cluster_ab_20b5a00.json), but once norm_fwd's loop was too (b5a5b41) the
                              # register kernel led again (bf16 16K 0.900 vs 0.869, float32 8K 0.944 both; at 4
                              # blocks bf16 32K 0.816 vs 0.852, float32 16K 0.882 vs 0.887;
                              # logs/ln_affine_plan_ab_af82988.json)
FWD_CLUSTER_PLAIN_LAYER_BYTES = 128 << 10  # ... except float32 rows of at least this many bytes (32K: the cluster
                                           # geometry's longest), which take it in the held form (FWD_CLUSTER_HOLD's):
                                           # 0.72 -> 0.84 of copy. It did not gain on float32 8K / 16K (0.87 against
                                           # 0.90 / 0.88), bf16 8K-32K (16K 0.75 against 0.80, the others even;
                                           # logs/norm_sweep_hold_d562161.json against norm_sweep_d562161.json) or
                                           # bf16 64K (0.644 against 0.656, logs/ln64k_{held,noheld}_b3a096c.json);
                                           # None: never
FWD_CLUSTER_RMS32_WHOLE = False  # float32 RMSNorm rows without residual that norm_fwd holds whole in registers (at
                                 # most NV * FWD_MAX_THREADS vectors: hidden 8K) take the cluster path (True, as
                                 # before); False: norm_fwd. H200, same run (norm_short_ab_4d231be.json): float32 8K
                                 # 0.966 -> 0.983 of a copy of x (Triton 0.977); bfloat16 16K stays on the cluster path
                                 # (0.970 there against 0.921 in registers)
FWD_MAX_THREADS = MAX_THREADS = 512  # __launch_bounds__ of norm_fwd / norm_bwd; the forward's block-path cap
BWD_MAX_THREADS = 512  # threads per row in the backward (fewer: more blocks per SM, longer rows re-read)
BWD_STREAM = True        # backward rows of whole 16-byte vectors through norm_bwd_stream (cp.async staging) ...
BWD_STREAM_VECS = (64, 2048)  # ... when they have this many vectors (two per thread up to 1024 vectors, four
                              # beyond; at most 512 threads; bf16 hidden 512-16384, float32 256-8192). bf16
                              # LayerNorm probe on the H200: 0.86-0.905 of copy at 1K-8K, norm_bwd 0.57-0.65
                              # (experiments/scratch/lnb_probe.py)
BWD_STREAM_STAGES = 3    # rows in shared memory per group: the current one and two ahead
BWD_CLUSTER_SIZES = (2, 4, 8)  # compute capability >= 9.0: longer whole-vector rows split over the blocks of a
                               # thread-block cluster (norm_bwd_cluster), the smallest size that leaves each block
                               # at most BWD_STREAM_VECS[1] vectors (up to 8 x 2048); () turns the path off
BWD_CLUSTER_LAG = True  # norm_bwd_cluster: a row's second pass after the next row's first (the peers' sums a pass
                        # late, no wait); False: each row waits for them (study setting)
_SM90_OPTIONS = ("--gpu-architecture=sm_90",)  # cluster kernels compile for sm_90+ only (cuflash._compile)
HOLD = True     # rows of whole 16-byte vectors: a thread's columns are the same in every row, so its weight/bias
                # vectors (and the backward's dw/db partial sums) stay in registers across rows for its first
                # NH chunks (_HELD_*) instead of being re-loaded per row, at the occupancy of before. Study
                # settings (compiled on first use): False, NH = 0 (loaded per row, as before); "all"
                # (norm_fwd only), every register chunk held, launch bounds relaxed to 128 registers (fewer
                # blocks per SM). The streamed backward (norm_bwd_stream) always holds its weights and dw/db
                # partial sums (two vectors a thread) and ignores HOLD
_TYPES = (_dtypes.float32, _dtypes.float16, _dtypes.bfloat16)
_NULL = np.uint64(0)  # a null pointer argument


def _wtypes(dt):
    """Weight/bias dtypes accepted with inputs of dtype ``dt``: float32 or ``dt`` itself."""
    return (_dtypes.float32,) if dt == _dtypes.float32 else (_dtypes.float32, dt)


def _nv_warp(dt):
    """16-byte vectors per lane on the forward's warp-per-row path (6 for float32, 4 for 16-bit types)."""
    return min(NV_WARP_BYTES, 32 * np.dtype(dt).itemsize) // 16


# NH of norm_fwd: how many of a thread's NV register chunks also hold their weight (and bias) vectors in
# registers across rows. The most that ptxas (CUDA 13.0, sm_80 and sm_90) fits without spilling under the
# kernel's __launch_bounds__, which are those the kernel had before NH (so its occupancy is unchanged):
# LayerNorm's two arrays leave room for few chunks, RMSNorm's one for all (float32 warp path: 4 of its 6; its
# values were set when that path held 8 vectors a lane, NV_WARP_BYTES = 128, and not searched again at 6).
# Keyed by (kind, residual, warp path); values for float32, 16-bit with 16-bit weights, 16-bit with float32
# weights. tests/test_compile.py checks that none spills. 16-bit LayerNorm without residual holds none: its
# weights and bias loaded per chunk leave it fewer registers and more rows in flight, 0.92-0.95 of the copy
# bandwidth in a probe on the H200 against 0.71-0.74 holding one chunk (logs/ln_probe_e0db513.json).
_HELD_FWD = {
    (LAYER, False, False): (2, 0, 0), (LAYER, False, True): (1, 0, 0),
    (LAYER, True, False): (4, 4, 2), (LAYER, True, True): (2, 2, 1),
    (RMS, False, False): (4, 4, 3), (RMS, False, True): (4, 4, 3),
    (RMS, True, False): (4, 4, 4), (RMS, True, True): (4, 4, 4),
}
# NH of norm_bwd (weights and dw/db partial sums held), the same way under its 128-register bound: a thread
# already holds its chunks of x and dy, and a 16-bit LayerNorm chunk's two partial sums take 16 registers.
_HELD_BWD = {LAYER: (3, 1, 1), RMS: (4, 2, 2)}


def _held(table, dt, wdt):
    """The entry of a _HELD_* row for input dtype ``dt`` and weight dtype ``wdt`` (0 when HOLD is off)."""
    if not HOLD:
        return 0
    return table[0 if dt == _dtypes.float32 else 1 if wdt == dt else 2]


def _stream_held(dt, wdt, kind, warp=False, res=False):
    """NH of norm_fwd_stream: its occupancy is bound by shared memory (one 512-thread block per SM, two
    256-thread blocks on the warp path), so it holds up to 8 chunks (its block-path rows have >= 8 per thread)
    within a budget of 64 registers (32 on the warp path, whose launch bounds promise two blocks; 48 on the block
    path with a residual: 16-bit LayerNorm spilled 16-32 bytes for sm_80 at 64): a chunk of weight (and bias)
    vectors takes 4 registers per array, 8 for float32 weights with 16-bit inputs."""
    if not HOLD:
        return 0
    regs = (2 if kind == LAYER else 1) * 16 // np.dtype(dt).itemsize * np.dtype(wdt).itemsize // 4
    return min(8, (32 if warp else 48 if res else 64) // regs)


def _fwd_name(dt, wdt, kind, res=False, warp=False, two_pass=None, aligned=False, smemc=False):
    """``two_pass`` (LayerNorm): the row is held entirely on chip (nchunks <= NV, always on the warp path; or with
    ``smemc`` nchunks <= NV + smem_chunks), so its statistics are two plain sums instead of Welford/Chan merges;
    None = the warp path's value.
    ``aligned`` (two-pass LayerNorm only): hidden is a multiple of the 16-byte vector, so every row starts on one
    (the wrapper aligns the base pointers): the kernel without head/tail scalars or scalar weight loads.
    ``smemc`` (block path): the row has shared-memory chunks, filled by cp.async; the kernels of rows without
    them compile as before (a shared instantiation slowed fused RMSNorm at 2K-16K by 10-15 %)."""
    b = lambda v: "true" if v else "false"  # noqa: E731
    nv = _nv_warp(dt) if warp else NV
    # blocks per SM promised by the launch bounds (as before NH): on the block path two 512-thread blocks at
    # <= 64 registers (one block's load phase overlaps another's reduction and stores), on the warp path three
    # 256-thread blocks at <= 80; with the residual (a second row in registers) one / two blocks at <= 128
    minb = (2 if res else 3) if warp else (1 if res else 2)
    nh = _held(_HELD_FWD[(kind, bool(res), bool(warp))], dt, wdt)
    if HOLD == "all":
        nh, minb = nv, (2 if warp else 1)
    two_pass = kind == LAYER and (warp if two_pass is None else (warp or two_pass))
    return (f"cuflash::norm_fwd<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, {nv}, {nh}, {minb}, "
            f"{b(res)}, {b(warp)}, {b(two_pass)}, {b(two_pass and aligned)}, {b(smemc and not warp)}>")


def _stream_name(dt, wdt, kind, res=False, warp=False, stages=None):
    """``stages``: rows in shared memory per group (the kernel's default: 3 on the warp path, 2 on the block path)."""
    b = lambda v: "true" if v else "false"  # noqa: E731
    nh = _stream_held(dt, wdt, kind, warp, res)
    st = "" if stages in (None, 3 if warp else 2) else f", {stages}"
    return (f"cuflash::norm_fwd_stream<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, {nh}, {b(res)}, "
            f"{b(warp)}{st}>")


def _fwd_cluster_name(dt, wdt, kind, res, c, hold=False, prefetch=0):
    """prefetch: 0, or the prefetching held kernel's launch-bounds blocks per SM."""
    assert hold or not prefetch, "the prefetching kernel is the held one"
    tail = f", true, {prefetch}" if prefetch else ", true" if hold else ""
    return (f"cuflash::norm_fwd_cluster<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, "
            f"{'true' if res else 'false'}, {c}{tail}>")


def _bwd_name(dt, wdt, kind):
    nh = _held(_HELD_BWD[kind], dt, wdt)
    return f"cuflash::norm_bwd<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, {NV}, {nh}>"


def _bwd_stream_name(dt, wdt, kind, vpt=2):
    return (f"cuflash::norm_bwd_stream<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, {BWD_STREAM_STAGES}, "
            f"{vpt}, 512, 1>")


def _bwd_cluster_name(dt, wdt, kind, c, lag=None):
    lag = BWD_CLUSTER_LAG if lag is None else lag
    return (f"cuflash::norm_bwd_cluster<{_dtypes.ctype(dt)}, {_dtypes.ctype(wdt)}, {kind}, {BWD_STREAM_STAGES}, "
            f"{c}, {'true' if lag else 'false'}>")


def _red_name(odt):
    return f"cuflash::reduce_parts<{_dtypes.ctype(odt)}>"


def _declare():
    names = []
    for dt in _TYPES:
        for wdt in _wtypes(dt):
            for kind in (LAYER, RMS):
                names += [f(dt, wdt, kind, res, warp) for f in (_fwd_name, _stream_name)
                          for res in (False, True) for warp in (False, True)]
                names += [_stream_name(dt, wdt, kind, res, False, 3) for res in (False, True)]
                if kind == LAYER:  # block path, row in registers; both paths' aligned two-pass kernels
                    names += [_fwd_name(dt, wdt, kind, res, warp, True, aligned)
                              for res in (False, True) for warp in (False, True) for aligned in (False, True)
                              if aligned or not warp]
                names += [_fwd_name(dt, wdt, kind, res, False, False, False, True) for res in (False, True)]
                if kind == LAYER:  # rows on chip with shared-memory chunks: two-pass statistics
                    names += [_fwd_name(dt, wdt, kind, res, False, True, aligned, True)
                              for res in (False, True) for aligned in (False, True)]
                names += [_bwd_name(dt, wdt, kind)] + [_bwd_stream_name(dt, wdt, kind, v) for v in (2, 4)]
        names.append(_red_name(dt))
    _compile.declare(_SRC, names)
    _compile.declare(_SRC, [_fwd_cluster_name(dt, wdt, kind, res, c) for dt in _TYPES for wdt in _wtypes(dt)
                            for kind in (LAYER, RMS) for res in (False, True) for c in (2, 4, 8)],
                     extra_options=_SM90_OPTIONS)
    # the held form, without residual only (with it the persistent form spills): float32 LayerNorm's long rows
    # (FWD_CLUSTER_PLAIN_LAYER_BYTES); the rest for the study setting FWD_CLUSTER_HOLD
    for release in (True, False):
        _compile.declare(_SRC, [_fwd_cluster_name(dt, wdt, kind, False, c, True) for dt in _TYPES
                                for wdt in _wtypes(dt) for kind in (LAYER, RMS) for c in (2, 4, 8)
                                if release == (kind == LAYER and dt.itemsize == 4)],
                         extra_options=_SM90_OPTIONS, release=release)
    # the study setting FWD_CLUSTER_PREFETCH: the held form with the next row prefetched
    _compile.declare(_SRC, [_fwd_cluster_name(dt, wdt, kind, False, c, True, n) for dt in _TYPES
                            for wdt in _wtypes(dt) for kind in (LAYER, RMS) for c in (2, 4, 8)
                            for n in PREFETCH_BLOCKS[kind]], extra_options=_SM90_OPTIONS, release=False)
    for lag in (True, False):  # the release setting and the study one
        _compile.declare(_SRC, [_bwd_cluster_name(dt, wdt, kind, c, lag) for dt in _TYPES for wdt in _wtypes(dt)
                                for kind in (LAYER, RMS) for c in (2, 4, 8)], extra_options=_SM90_OPTIONS,
                         release=lag)


_declare()


# ------------------------------------------------------------------------------------------------------------
# validation helpers (no device work)
def _cupy():
    import cupy

    return cupy


def _as_device(a, what):
    """A CuPy view of ``a`` (the one conversion of every wrapper: cuflash._attn_common.as_cupy; a host array
    raises TypeError rather than being copied)."""
    return as_cupy(a, what)


def _normalized_shape(normalized_shape, fn):
    """``normalized_shape`` as a tuple of ints: an int or a sequence of ints (a string, float or bool raises
    TypeError, as torch); ``fn`` names the caller in the message."""
    if isinstance(normalized_shape, (int, np.integer, bool, np.bool_)):
        return (as_int(normalized_shape, f"{fn}: normalized_shape"),)
    if isinstance(normalized_shape, (str, bytes)) or not hasattr(normalized_shape, "__iter__"):
        raise TypeError(f"{fn}: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    return tuple(as_int(s, f"{fn}: normalized_shape entry") for s in normalized_shape)


def _check_param(p, name, nshape, dt, fn):
    if p is None:
        return None
    p = _as_device(p, f"{fn}: {name}")
    if tuple(p.shape) != nshape:
        raise ValueError(f"{fn}: {name} has shape {tuple(p.shape)}, expected normalized_shape {nshape}")
    if p.dtype not in _wtypes(dt):  # (the message, with its dtype names, is built only here)
        _dtypes.check_dtype(p.dtype, _wtypes(dt), f"{fn}: {name} (with input dtype {dt})")
    return p


def _geometry(itemsize: int, hidden: int, smem_budget: int = 0, max_threads: int = MAX_THREADS):
    """Row geometry shared by the kernels: (G threads per row, nchunks, smem_chunks).

    A row is at most ``hidden // VEC`` aligned 16-byte vectors (VEC = 16 / itemsize) plus < VEC head and < VEC
    tail scalars. Thread t owns vectors ``k * G + t`` for chunks ``k < nchunks``: the first NV in registers,
    the next ``smem_chunks`` in shared memory (``smem_budget`` bytes), any others re-read in the second pass.
    G is a multiple of 32 in [32, MAX_THREADS], just enough to hold the row in NV chunks where it can.
    """
    body = hidden // (16 // itemsize)
    G = min(max_threads, max(32, 32 * math.ceil(math.ceil(body / NV) / 32)))
    nchunks = math.ceil(body / G)
    smem_chunks = min(max(0, nchunks - NV), max(0, smem_budget) // (G * 16))
    return G, nchunks, smem_chunks


_FWD_CFG: dict = {}


def _resident_blocks(kern, threads, smem, dev):
    """Blocks of ``threads`` threads and ``smem`` dynamic shared bytes that fit on one SM at once."""
    cp = _cupy()
    props = cp.cuda.runtime.getDeviceProperties(dev)
    regs = max(32, int(getattr(kern, "num_regs", 64) or 64))
    by_regs = props.get("regsPerMultiprocessor", 65536) // (8 * math.ceil(regs / 8) * threads)
    by_threads = props.get("maxThreadsPerMultiProcessor", 2048) // threads
    by_smem = props.get("sharedMemPerMultiprocessor", 228 * 1024) // (smem + 1024 + 512)
    return max(1, min(32, by_regs, by_threads, by_smem))


FwdPlan = namedtuple("FwdPlan", "stream kern G rpb nchunks smem_chunks smem cap nvr cluster", defaults=(0,))
FwdPlan.__doc__ = """How the forward runs for one row length: streamed (norm_fwd_stream) or registers (norm_fwd);
G threads per row, rows per block, chunks per thread (register kernel), shared-memory chunks, dynamic shared
bytes, grid cap, vectors per thread (streamed kernel); ``cluster`` > 0: norm_fwd_cluster, a row over that many
blocks of G threads (one row per cluster when the cap is 0, else persistent clusters up to ``cap`` blocks)."""


def _cluster_split(body, sizes, per_block):
    """(C, G) for a row of ``body`` 16-byte vectors over a thread-block cluster, four vectors a thread: C the
    smallest of ``sizes`` that leaves each block at most ``per_block`` vectors, G a multiple of 32 just enough for
    the block's share; None when no size does."""
    for c in sorted(sizes):
        share = math.ceil(body / c)
        if share <= per_block:
            return c, 32 * math.ceil(math.ceil(share / 4) / 32)
    return None


def _fwd_cluster_geometry(itemsize, hidden, cc):
    """(C blocks per row, G threads per block) of the cluster forward (norm_fwd_cluster), or None where it does
    not apply: compute capability ``cc`` < 90, rows not whole 16-byte vectors, fewer than FWD_CLUSTER_MIN_VECS
    of them, or more than C * 4 * FWD_CLUSTER_MAX_THREADS for every C in FWD_CLUSTER_SIZES. C is the smallest
    size that leaves each block at most 4 * FWD_CLUSTER_MAX_THREADS vectors (four a thread); G a multiple of 32
    just enough for the block's share."""
    vec = 16 // itemsize
    body = hidden // vec
    if (cc or 0) < 90 or hidden % vec or body < FWD_CLUSTER_MIN_VECS:
        return None
    return _cluster_split(body, FWD_CLUSTER_SIZES, 4 * FWD_CLUSTER_MAX_THREADS)


def _stream_plan(kind, dt, wdt, hidden, res, dev, budget):
    """The streamed forward's plan, or None where it does not apply (rows not whole 16-byte vectors, or too long
    for two stages in shared memory)."""
    vec = 16 // dt.itemsize
    if not STREAM or hidden % vec or hidden // vec < STREAM_MIN_VECS:
        return None
    body = hidden // vec
    arrays = 2 if res else 1
    if body <= STREAM_WARP_MAX_VECS:
        warp, G, stages = True, 32, 3
        nvr = math.ceil(body / 32)
        rpb = 8 if stages * arrays * nvr * 16 * 256 <= 100 * 1024 else 4
    else:
        warp, rpb = False, 1
        G = min(MAX_THREADS, 32 * math.ceil(body / STREAM_VECS_PER_THREAD / 32))
        nvr = math.ceil(body / G)
        stages = STREAM_STAGES if STREAM_STAGES * arrays * nvr * 16 * G <= budget else 2
    smem = stages * arrays * nvr * 16 * G * rpb
    if smem > budget:
        return None
    kern = _compile.get_kernel(_SRC, _stream_name(dt, wdt, kind, res, warp, stages))
    cap = _resident_blocks(kern, G * rpb, smem, dev) * _compile.sm_count(dev)
    return FwdPlan(True, kern, G, rpb, 0, 0, smem, cap, nvr)


def _plain_layer_held(kind, dt, hidden, res):
    """Whether a float32 LayerNorm row without residual is long enough (FWD_CLUSTER_PLAIN_LAYER_BYTES) for the
    held cluster forward."""
    return (kind == LAYER and not res and dt.itemsize == 4 and FWD_CLUSTER_PLAIN_LAYER_BYTES is not None
            and hidden * dt.itemsize >= FWD_CLUSTER_PLAIN_LAYER_BYTES)


def _fwd_config(kind, dt, wdt, hidden, res, dev, affine=True):
    """The :data:`FwdPlan` of one row length (cached); ``affine``: a weight or a bias is given.

    On compute capability 9.0, rows that :func:`_fwd_cluster_geometry` covers run ``norm_fwd_cluster`` when they
    are RMSNorm (but float32 rows without residual that norm_fwd holds whole: ``FWD_CLUSTER_RMS32_WHOLE``) or
    fused-residual rows, LayerNorm rows without weight and bias over at most
    ``FWD_CLUSTER_LAYER_NO_AFFINE`` blocks, LayerNorm rows with weights of x's dtype over at most
    ``FWD_CLUSTER_LAYER_AFFINE`` blocks, or float32 plain LayerNorm rows of ``FWD_CLUSTER_PLAIN_LAYER_BYTES``
    (these in the held, persistent form). Otherwise:
    Rows of whole 16-byte vectors that fit two stages in shared memory are streamed (``norm_fwd_stream``: a warp
    per row up to ``STREAM_WARP_MAX_VECS`` vectors, else a block). Others run ``norm_fwd`` with the row in
    registers: a warp per row for rows of at most ``32 * _nv_warp(dt)`` vectors (``WARP_ROWS`` rows per block;
    16-bit RMSNorm without residual only with ``WARP_RMS16``),
    longer rows a block of G threads per row (:func:`_geometry`) with shared memory and re-reads beyond."""
    key = (kind, dt, wdt, hidden, res, dev, WARP_ROWS, FWD_WAVES, FWD_MAX_THREADS, STREAM, STREAM_MIN_VECS,
           STREAM_WARP_MAX_VECS, STREAM_VECS_PER_THREAD, STREAM_STAGES, HOLD, FWD_CLUSTER_SIZES, FWD_CLUSTER_MIN_VECS,
           FWD_CLUSTER_MAX_THREADS, FWD_CLUSTER_PLAIN_LAYER, FWD_CLUSTER_HOLD, FWD_CLUSTER_PLAIN_LAYER_BYTES,
           FWD_CLUSTER_PREFETCH, bool(affine), FWD_CLUSTER_LAYER_NO_AFFINE, FWD_CLUSTER_LAYER_AFFINE, WARP_RMS16,
           FWD_CLUSTER_RMS32_WHOLE, NV, NV_WARP_BYTES)
    cfg = _FWD_CFG.get(key)
    if cfg is None:
        geo = _fwd_cluster_geometry(dt.itemsize, hidden, _compile.compute_capability(dev))
        body = hidden // (16 // dt.itemsize)
        rms32_whole = kind == RMS and not res and dt.itemsize == 4 and body <= NV * FWD_MAX_THREADS
        if rms32_whole and not FWD_CLUSTER_RMS32_WHOLE:
            geo = None  # float32 RMSNorm rows that norm_fwd holds whole in registers run there
        plain_held = _plain_layer_held(kind, dt, hidden, res)
        bare = geo is not None and not affine and not res and geo[0] <= FWD_CLUSTER_LAYER_NO_AFFINE
        # norm_fwd_cluster (not held) copies weights of x's dtype (16-byte vectors) to shared memory per row
        stages = affine and wdt.itemsize == dt.itemsize
        staged = geo is not None and stages and not res and geo[0] <= FWD_CLUSTER_LAYER_AFFINE
        if geo is not None and (kind == RMS or res or FWD_CLUSTER_PLAIN_LAYER or plain_held or bare or staged):
            c, G = geo
            hold = (FWD_CLUSTER_HOLD or plain_held) and not res
            pf = 0 if not (hold and FWD_CLUSTER_PREFETCH) else FWD_CLUSTER_PREFETCH if kind == LAYER else 4
            kern = _compile.get_kernel(_SRC, _fwd_cluster_name(dt, wdt, kind, res, c, hold, pf), _SM90_OPTIONS)
            cap = smem = 0  # one row per cluster; held: as many clusters as the device holds at once,
            if hold or stages:  # each thread's weight and bias vectors in shared memory: held, or copied per row
                smem = 4 * G * 16 * wdt.itemsize // dt.itemsize * (2 if kind == LAYER else 1)
            if hold:
                cap = c * (_compile.max_active_clusters(kern, c, G, smem) or _compile.sm_count(dev) // (2 * c))
            cfg = _FWD_CFG[key] = FwdPlan(False, kern, G, 1, 4, 0, smem, cap, 4, c)
            return cfg
        budget = _compile.max_shared_optin(dev) - 1024  # static shared memory of the reductions
        cfg = _stream_plan(kind, dt, wdt, hidden, res, dev, budget)
        if cfg is not None:
            _FWD_CFG[key] = cfg
            return cfg
        rms16 = kind == RMS and not res and dt.itemsize == 2
        warp = body <= 32 * _nv_warp(dt) and WARP_ROWS > 0 and (WARP_RMS16 or not rms16)
        if warp:
            G, rpb, nchunks, smem_chunks = 32, WARP_ROWS, max(1, math.ceil(body / 32)), 0
        else:
            # with a residual, a shared-memory chunk also stages the residual's vectors (norm_fwd's rcache)
            G, nchunks, smem_chunks = _geometry(dt.itemsize, hidden, budget // (2 if res else 1), FWD_MAX_THREADS)
            rpb = 1
        aligned = hidden % (16 // dt.itemsize) == 0  # every base pointer is 16-byte aligned (_forward)
        on_chip = nchunks <= NV + smem_chunks  # LayerNorm: two-pass statistics (nothing re-read from HBM)
        kern = _compile.get_kernel(_SRC, _fwd_name(dt, wdt, kind, res, warp, on_chip, aligned, smem_chunks > 0))
        smem = smem_chunks * G * 16 * (2 if res else 1)
        cap = 1 << 22
        if FWD_WAVES > 0:
            cap = FWD_WAVES * _resident_blocks(kern, G * rpb, smem, dev) * _compile.sm_count(dev)
        cfg = _FWD_CFG[key] = FwdPlan(False, kern, G, rpb, nchunks, smem_chunks, smem, cap, 0)
    return cfg


def _forward(kind, fn, x, normalized_shape, weight, bias, eps, residual, return_stats):
    cp = _cupy()
    x = _as_device(x, f"{fn}: x")
    dt = _dtypes.check_dtype(x.dtype, _TYPES, f"{fn}: x")
    nshape = _normalized_shape(normalized_shape, fn)
    return_stats = as_bool(return_stats, f"{fn}: return_stats")
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
    eps = as_float(eps, f"{fn}: eps")
    if eps < 0.0:
        raise ValueError(f"{fn}: eps must be >= 0, got {eps}")

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
        pl = _fwd_config(kind, dt, np.dtype(wdt), hidden, residual is not None, dev,
                         affine=weight is not None or bias is not None)
        # the cluster kernel: one row per cluster, or (the held form) at most cap / C clusters taking rows
        # cluster-stride (rows * C < 2**31 blocks: rows of >= 2048 vectors that many would not fit in memory)
        if pl.cluster:
            grid = pl.cluster * (min(rows, pl.cap // pl.cluster) if pl.cap else rows)
        else:
            grid = min(math.ceil(rows / pl.rpb), pl.cap)
        tail = (() if pl.cluster else (np.int32(pl.nvr), _compile.stream_counters(dev) if STREAM_TICKET else _NULL) if pl.stream
                else (np.int32(pl.nchunks), np.int32(pl.smem_chunks)))
        _compile.launch(pl.kern, (grid,), (pl.G * pl.rpb,),
                        (x, residual if residual is not None else _NULL, weight if weight is not None else _NULL,
                         bias if bias is not None else _NULL, y, h if h is not None else _NULL,
                         mean if mean is not None else _NULL, rstd if rstd is not None else _NULL,
                         np.int64(rows), np.int32(hidden), np.float32(eps)) + tail,
                        shared_mem=pl.smem, what=lambda: f"{fn} hidden={hidden} {dt}")
    out = (y,) if h is None else (y, h)
    if return_stats:
        out = out + ((mean, rstd) if kind == LAYER else (rstd,))
    return out[0] if len(out) == 1 else out


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, residual=None, return_stats=False):
    """LayerNorm over the trailing ``normalized_shape`` dims, optionally fused with the residual add.

    ``y = (h - mean) * rstd * weight + bias`` with ``h = x`` (or ``h = x + residual`` rounded to ``x.dtype``),
    ``mean`` and the biased variance ``var`` over the normalised dims, ``rstd = 1 / sqrt(max(var, 0) + eps)``.
    LayerNorm of Ba et al. 2016 (as ``torch.nn.functional.layer_norm``); the float32 statistics are the two-pass
    formula (mean, then squared deviations from it) for rows held on chip (up to ~100K elements), else Welford
    1962 running updates merged with the pairwise formula of Chan et al. 1979 (Chan, Golub & LeVeque). Float32
    statistics overflow once |h - mean| exceeds ~1.8e19 (the squared deviations; torch's do too) or, for rows on
    chip, once the row sum exceeds ~3.4e38 (|h| ~ 3.4e38 / hidden): y is then the bias (as torch's) in
    the first case, NaN in the second.

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
        TypeError: ``x``, weight, bias or residual not a CuPy/CUDA array (host arrays included); ``x`` not
            float32/float16/bfloat16; ``normalized_shape`` neither an int nor iterable (e.g. None); weight/bias
            dtype other than float32 or ``x.dtype``, or weight and bias of different dtypes; a residual of
            another dtype than ``x``; ``normalized_shape`` entries or an ``eps`` that are not ints / real numbers
            (strings, floats in the shape, bools); ``return_stats`` not a bool.
        ValueError: ``normalized_shape`` not the trailing dims of ``x``, empty, with no elements or with 2**31
            or more; weight/bias/residual shape mismatch; eps negative, NaN, infinite or beyond float32. All before
            any launch.
    """
    return _forward(LAYER, "layer_norm", x, normalized_shape, weight, bias, eps, residual, return_stats)


def rms_norm(x, normalized_shape, weight=None, eps=None, *, residual=None, return_stats=False):
    """RMSNorm over the trailing ``normalized_shape`` dims, optionally fused with the residual add.

    ``y = h * rstd * weight``, ``rstd = 1 / sqrt(mean(h^2) + eps)`` with ``h^2`` accumulated in float32;
    ``eps=None`` means ``finfo(float32).eps`` = 1.1920929e-07 for every dtype (the epsilon of the float32
    statistics, as ``torch.nn.functional.rms_norm`` since torch 2.6; not ``finfo(x.dtype).eps``, which is 7.8e-3 for
    bfloat16). RMSNorm of Zhang & Sennrich 2019 (no mean subtraction, no bias).

    Returns ``y``; with ``residual``: ``(y, h)``; with ``return_stats``: ``(y, rstd)`` or ``(y, h, rstd)``
    (``rstd`` float32, shape ``x.shape[:-len(normalized_shape)]``). Arguments and dtypes as :func:`layer_norm`
    (``x`` ``(..., *normalized_shape)`` float32/float16/bfloat16; ``weight`` float32 or ``x.dtype``; no bias).

    Raises:
        TypeError / ValueError: as :func:`layer_norm` (the weight and residual cases; there is no bias).
    """
    if eps is None:  # torch's default: the epsilon of its float32 ("opmath") statistics, whatever x's dtype
        eps = RMS_DEFAULT_EPS
    return _forward(RMS, "rms_norm", x, normalized_shape, weight, None, eps, residual, return_stats)


# ------------------------------------------------------------------------------------------------------------
# backward
_BWD_CFG: dict = {}
BwdPlan = namedtuple("BwdPlan", "stream kern G rpb nchunks smem dw_global db_global max_blocks vpt cluster")
BwdPlan.__doc__ = """How the backward runs for one row length: ``stream`` (norm_bwd_stream: rows of whole 16-byte
vectors, staged by cp.async, ``vpt`` vectors a thread) or norm_bwd (row in registers, general). ``G`` threads per
row (per block), ``rpb`` rows per block at a time, ``smem`` dynamic shared bytes, ``max_blocks`` the persistent
grid's cap (resident blocks); every block writes ``rpb`` partial dw/db rows when streamed, one otherwise.
``cluster`` > 1: norm_bwd_cluster, that many blocks per row, ``max_blocks`` // ``cluster`` clusters at most (the
ones the device holds at once), one partial row per cluster."""


def _bwd_stream_geometry(itemsize, hidden, cc=None):
    """(G threads per row and block, rows per block, VPT vectors per thread, C blocks per row) of the streamed
    backward for this row length, or None where it does not apply. Rows of whole 16-byte vectors only (BWD_STREAM
    on): with BWD_STREAM_VECS[0] to [1] of them, one block (norm_bwd_stream, C = 1): two vectors per thread up to
    1024 vectors, four beyond (G = 288..512), max(1, 128 // G) rows per block (blocks of 96 to 512 threads: 96
    for rows of 129 to 192 vectors); with more, on compute capability ``cc`` >= 90, a cluster of C in
    BWD_CLUSTER_SIZES blocks (norm_bwd_cluster), the smallest that leaves each block at most BWD_STREAM_VECS[1]
    vectors, four per thread. G a multiple of 32, just enough to cover the row (or the block's share)."""
    vec = 16 // itemsize
    body = hidden // vec
    lo, hi = BWD_STREAM_VECS
    if not BWD_STREAM or hidden % vec or body < lo:
        return None
    if body <= hi:
        vpt = 2 if body <= 1024 else 4
        G = 32 * math.ceil(math.ceil(body / vpt) / 32)
        return G, max(1, 128 // G), vpt, 1
    if (cc or 0) < 90:
        return None
    split = _cluster_split(body, BWD_CLUSTER_SIZES, hi)
    return None if split is None else (split[1], 1, 4, split[0])


def _bwd_config(kind, dt, wdt, hidden, has_w, dev):
    key = (kind, dt, wdt, hidden, has_w, dev, BWD_MAX_THREADS, HOLD, BWD_STREAM, BWD_STREAM_VECS, BWD_STREAM_STAGES,
           BWD_CLUSTER_SIZES, BWD_CLUSTER_LAG)
    cfg = _BWD_CFG.get(key)
    if cfg is not None:
        return cfg
    geo = _bwd_stream_geometry(dt.itemsize, hidden, _compile.compute_capability(dev))
    # [stage][x | dy][vpt vectors][thread] of 16 bytes; a device with less shared memory takes norm_bwd
    smem = BWD_STREAM_STAGES * 2 * geo[2] * geo[0] * geo[1] * 16 if geo else 0
    if geo is not None and smem <= _compile.max_shared_optin(dev) - 1024:
        G, rpb, vpt, c = geo
        if c == 1:
            kern = _compile.get_kernel(_SRC, _bwd_stream_name(dt, wdt, kind, vpt))
            max_blocks = _resident_blocks(kern, G * rpb, smem, dev) * _compile.sm_count(dev)
        else:  # as many clusters as the device holds at once (the driver knows how SMs group), else a guess
            kern = _compile.get_kernel(_SRC, _bwd_cluster_name(dt, wdt, kind, c), _SM90_OPTIONS)
            n = _compile.max_active_clusters(kern, c, G, smem)
            max_blocks = c * (n or _compile.sm_count(dev) // (2 * c))
        cfg = _BWD_CFG[key] = BwdPlan(True, kern, G, rpb, vpt, smem, 0, 0, max_blocks, vpt, c)
        return cfg
    G, nchunks, _ = _geometry(dt.itemsize, hidden, 0, BWD_MAX_THREADS)
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
    per_sm = _resident_blocks(kern, G * rows_per_block, smem, dev)
    cfg = _BWD_CFG[key] = BwdPlan(False, kern, G, rows_per_block, nchunks, smem, dw_global, db_global,
                                  per_sm * _compile.sm_count(dev), 0, 1)
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
    pl = _bwd_config(kind, dt, wdt, hidden, weight is not None, dev)
    if pl.cluster > 1:  # clusters of pl.cluster blocks, one row at a time each; one partial row per cluster
        nparts = max(1, min(rows, pl.max_blocks // pl.cluster))
        nb = nparts * pl.cluster
    else:  # one partial row per group (streamed) or per block
        nb = max(1, min(math.ceil(rows / pl.rpb), pl.max_blocks))
        nparts = nb * pl.rpb if pl.stream else nb
    ws_dw = cp.empty((nparts, hidden), np.float32) if weight is not None else None
    ws_db = cp.empty((nparts, hidden), np.float32) if kind == LAYER else None
    common = (dy, x, weight if weight is not None else _NULL, mean if kind == LAYER else _NULL, rstd, dx,
              ws_dw if ws_dw is not None else _NULL, ws_db if ws_db is not None else _NULL, np.int64(rows),
              np.int32(hidden))
    if pl.cluster > 1:
        tail = ()
    elif pl.stream:
        tail = (np.int32(pl.G),)
    else:
        tail = (np.int32(pl.nchunks), np.int32(pl.G), np.int32(pl.dw_global), np.int32(pl.db_global))
    _compile.launch(pl.kern, (nb,), (pl.G * pl.rpb,), common + tail, shared_mem=pl.smem,
                    what=lambda: f"{fn} hidden={hidden} {dt}")
    dw = db = None
    rgrid = (math.ceil(hidden / 32),)
    if ws_dw is not None:
        dw = cp.empty(nshape, dw_dt)
        _compile.launch(_compile.get_kernel(_SRC, _red_name(dw_dt)), rgrid, (1024,),
                        (ws_dw, dw, np.int32(nparts), np.int32(hidden)))
    if ws_db is not None:
        db = cp.empty(nshape, db_dt)
        _compile.launch(_compile.get_kernel(_SRC, _red_name(db_dt)), rgrid, (1024,),
                        (ws_db, db, np.int32(nparts), np.int32(hidden)))
    return (dx, dw, db) if kind == LAYER else (dx, dw)


def layer_norm_backward(dy, x, weight, mean, rstd):
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``.

    With ``xhat = (x - mean) * rstd``, ``g = dy * weight``:
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` (means over the normalised dims),
    ``dweight = sum_rows dy * xhat``, ``dbias = sum_rows dy``, reduced in float32: per-block (per row group
    on the streamed path, per cluster on the cluster path: rows of whole 16-byte vectors, 64..2048 of them, up
    to 8 x 2048 on compute capability 9.0) partial column sums into a float32
    ``[parts, hidden]`` workspace, then a second kernel sums the parts in a fixed order (deterministic for a
    given device, no atomics). The gradient of the LayerNorm of Ba et al. 2016 (chain rule through the mean and
    the biased variance).

    Args:
        dy, x: same shape and dtype (float32 / float16 / bfloat16); ``x`` is the normalised input (``h`` when
            the forward had a residual; ``dx`` is then also the gradient of ``x`` and of ``residual``).
        weight: ``normalized_shape`` array (float32 or ``x.dtype``) or None (then ``g = dy``, dweight None).
        mean, rstd: float32 statistics from ``layer_norm(..., return_stats=True)``; their shape (the leading
            dims of ``x``) fixes ``normalized_shape = x.shape[mean.ndim:]``.

    Returns:
        ``dx`` (``x.dtype``, shape of ``x``), ``dweight`` (``normalized_shape``, weight's dtype, or None),
        ``dbias`` (``normalized_shape``, weight's dtype; float32 when ``weight`` is None).

    Raises:
        TypeError: dy, x, weight, mean or rstd not a CuPy/CUDA array (host arrays, or None for ``mean``);
            ``x`` not float32/float16/bfloat16; ``dy`` of another dtype than ``x``; mean or rstd not float32;
            weight dtype other than float32 or ``x.dtype``.
        ValueError: ``dy`` not of x's shape; rstd not of the leading dims of ``x.shape`` (at least one trailing
            dim left); mean not of rstd's shape; normalised dims with no elements or 2**31 or more; weight not
            of shape ``normalized_shape``. All before any launch.
    """
    return _backward(LAYER, "layer_norm_backward", dy, x, weight, mean, rstd)


def rms_norm_backward(dy, x, weight, rstd):
    """Gradients of :func:`rms_norm`: ``(dx, dweight)``.

    With ``xhat = x * rstd``, ``g = dy * weight``: ``dx = rstd * (g - xhat * mean(g * xhat))``,
    ``dweight = sum_rows dy * xhat`` (float32 partials, deterministic second reduction): the gradient of the
    RMSNorm of Zhang & Sennrich 2019. ``dy``, ``x``, ``weight`` as :func:`layer_norm_backward`; ``rstd`` float32
    of shape ``x.shape[:k]`` fixes the normalised dims ``x.shape[k:]``. Returns ``dx`` (``x.dtype``, shape of
    ``x``) and ``dweight`` (``normalized_shape``, weight's dtype; None when ``weight`` is None).

    Raises:
        TypeError / ValueError: as :func:`layer_norm_backward`, without the ``mean`` cases.
    """
    return _backward(RMS, "rms_norm_backward", dy, x, weight, None, rstd)
