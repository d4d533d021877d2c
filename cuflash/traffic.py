"""HBM traffic models: the bytes each kernel and schedule must move between HBM and the chip.

Every function counts the global-memory bytes the *schedule* asks for (each element read or written in HBM
counted once per time the algorithm moves it), with no credit for L2 hits. Measured DRAM bytes
(:mod:`cuflash.ncu`) can be lower (L2 serves re-reads, e.g. K/V tiles shared by concurrent Q tiles) or higher
(write-allocate, partial sectors); the experiments print measured / modeled and flag differences above 10%.

Sources:
- Softmax passes: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018): naive softmax
  makes 3 memory accesses per element (2 loads, 1 store), safe softmax 4 (3 loads, 1 store), online softmax 3.
  A row held on chip needs 2 (1 load, 1 store): the floor for any softmax.
- Attention: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
  (NeurIPS 2022), Algorithm 0 (standard: S and P written to HBM) and Algorithm 1 (FlashAttention);
  Theorem 2: standard attention needs Theta(N d + N^2) HBM accesses, FlashAttention Theta(N^2 d^2 M^-1)
  for SRAM size M (d <= M <= N d). FlashAttention-2 (Dao, 2023), Algorithm 1: Q tiles outermost, so Q and
  O move once and K, V once per Q tile.
- Norms: a fused residual add + norm reads x and residual and writes y and the new residual (4 passes);
  unfused it is an add (2 reads, 1 write) then a norm (1 read, 1 write): 5 passes.
- Attention backward (:func:`attention_backward_bytes`): FlashAttention-2 (Dao 2023), Algorithm 2 (K/V tiles
  outermost, S and P recomputed from the saved lse, dQ accumulated through HBM); FlashAttention (Dao et al. 2022)
  Algorithm 4 / Appendix B.2. logsumexp (:func:`logsumexp_bytes`): the online normaliser alone, one read pass.
  Norm backward (:func:`norm_backward_bytes`): dy and x in, dx out, plus the two-stage dweight/dbias sums.
- Mixed-precision training (``cuflash.amp``, ``cuda_src/amp.cu``): Micikevicius et al., "Mixed Precision Training"
  (ICLR 2018): float32 master weights, float16/bfloat16 gradients and model copy, loss scaling with an overflow
  check; AdamW as Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019). The kernels are
  single-pass elementwise streams: every element of every operand moves once (the per-element byte counts in
  amp.cu's header), see :func:`unscale_and_check_bytes`, :func:`sgd_momentum_step_bytes`, :func:`adamw_step_bytes`.

Units: bytes (int). Element sizes from the dtype (float16/bfloat16 2, float32 4).
"""
from __future__ import annotations

import math

import numpy as np

from . import _dtypes
from ._attn_common import normalize_window

SOFTMAX_METHODS = ("naive", "safe", "online", "cached", "split")
# names other modules may use for the same schedules
_SOFTMAX_ALIASES = {"three_pass": "safe", "3pass": "safe", "safe3": "safe", "two_pass": "online",
                    "2pass": "online", "online2": "online", "single": "cached", "onchip": "cached",
                    "on_chip": "cached", "fused": "cached", "register": "cached", "smem": "cached",
                    "single_read": "cached", "split_row": "split", "splitrow": "split", "cluster": "cached", "held": "cached",
                    "auto": "cached", "online_cached": "cached", "warp": "cached",
                    "block": "cached", "stream": "online"}
SCHEDULES = ("standard", "fa1", "fa2")
ACC_BYTES = 4  # float32 accumulators, statistics and workspaces
FLAG_BYTES = 4  # the int32 found_inf / skip flag of the AMP kernels
TABLE_BYTES_PER_TENSOR = 24  # unscale_and_check's device table: int64 pointer, size and offset per tensor


def itemsize(dtype) -> int:
    """Bytes per element of ``dtype`` (accepts numpy dtypes, names, and 'bfloat16')."""
    if isinstance(dtype, str) and dtype in ("bf16", "bfloat16"):
        return 2
    if isinstance(dtype, str) and dtype in ("fp16", "half"):
        return 2
    if isinstance(dtype, str) and dtype in ("fp32",):
        return 4
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return np.dtype(getattr(_dtypes, str(dtype))).itemsize


def softmax_method(method: str) -> str:
    """The canonical name of a softmax schedule (``naive``, ``safe``, ``online``, ``cached``, ``split``)."""
    m = str(method).lower()
    m = _SOFTMAX_ALIASES.get(m, m)
    if m not in SOFTMAX_METHODS:
        raise ValueError(f"unknown softmax method {method!r}; known: {SOFTMAX_METHODS}")
    return m


def softmax_passes(method: str) -> int:
    """Memory passes over the row (loads + stores per element): naive 3, safe 4, online 3, cached 2, split 2.

    (Milakov & Gimelshein 2018, Sections 2-3.) ``online`` is the streaming two-pass form (state pass, then
    normalise pass); ``cached`` keeps the row on chip (one read, one write); ``split`` cuts a long row over
    K blocks that each keep their chunk on chip and merge partial (m, l) states through a workspace
    (one read, one write, plus the workspace: see :func:`softmax_bytes`).
    """
    return {"naive": 3, "safe": 4, "online": 3, "cached": 2, "split": 2}[softmax_method(method)]


def softmax_bytes(rows: int, cols: int, dtype, method: str = "cached", splits: int = 1, out_dtype=None) -> int:
    """HBM bytes of a row softmax over ``rows`` rows of ``cols`` elements.

    ``(passes - 1) * rows * cols * s_in + rows * cols * s_out`` with ``passes`` from :func:`softmax_passes`
    (one of the passes is the store of y). ``split``: each row is cut into ``splits`` chunks handled by
    different blocks; a workspace of ``rows * splits`` (m, l) float32 pairs is written once and read by every
    chunk (``rows * splits * splits * 8`` bytes read): ``2 * rows * cols * s_in + rows * cols * s_out + ws``.
    """
    m = softmax_method(method)
    s_in = itemsize(dtype)
    s_out = itemsize(out_dtype if out_dtype is not None else dtype)
    n = int(rows) * int(cols)
    total = (softmax_passes(m) - 1) * n * s_in + n * s_out
    if m == "split":
        k = max(int(splits), 1)
        total += int(rows) * k * 2 * ACC_BYTES + int(rows) * k * k * 2 * ACC_BYTES
    return int(total)


def norm_bytes(rows: int, hidden: int, dtype, kind: str = "layer", residual: bool = False, fused: bool = True,
               weight: bool = True, bias: bool | None = None, residual_out: bool = True,
               save_stats: bool = False) -> int:
    """HBM bytes of LayerNorm (``kind="layer"``) or RMSNorm (``"rms"``) over ``rows x hidden``.

    - no residual: read x, write y: ``2 N s`` (N = rows * hidden)
    - fused residual: read x and r, write y and (``residual_out``) h = x + r: ``4 N s`` (3 without h)
    - unfused residual: add (read x, r; write h) then norm (read h; write y): ``5 N s``
    plus weight (and bias, LayerNorm only by default) ``hidden * s`` each, read once, and with
    ``save_stats`` the float32 statistics per row (mean and rstd for LayerNorm, rstd for RMSNorm).
    """
    if kind not in ("layer", "rms"):
        raise ValueError(f"kind must be 'layer' or 'rms', got {kind!r}")
    s = itemsize(dtype)
    n = int(rows) * int(hidden)
    if not residual:
        passes = 2
    elif fused:
        passes = 4 if residual_out else 3
    else:
        passes = 5
    total = passes * n * s
    if bias is None:
        bias = kind == "layer"
    total += (int(bool(weight)) + int(bool(bias))) * int(hidden) * s
    if save_stats:
        total += int(rows) * ACC_BYTES * (2 if kind == "layer" else 1)
    return int(total)


def norm_flops(rows: int, hidden: int, kind: str = "layer", residual: bool = False) -> int:
    """Approximate FLOPs of a norm: ~8 per element for LayerNorm, ~6 for RMSNorm, +1 for the residual add."""
    per = 8 if kind == "layer" else 6
    return int(rows) * int(hidden) * (per + int(bool(residual)))


def softmax_flops(rows: int, cols: int, method: str = "cached") -> int:
    """Approximate FLOPs of a softmax: ~5 per element (max, subtract, exp, add, scale); online adds a rescale."""
    per = 6 if softmax_method(method) in ("online", "split") else 5
    return int(rows) * int(cols) * per


# ----------------------------------------------------------------------------------------------------------
# Attention
def _key_range(q_start, q_end, seqlen_q, seqlen_k, window):
    """Keys [lo, hi) visible to query rows [q_start, q_end) with bottom-right aligned masks (as prepare())."""
    shift = seqlen_k - seqlen_q
    left, right = window
    hi = seqlen_k if right < 0 else min(seqlen_k, q_end - 1 + shift + right + 1)
    lo = 0 if left < 0 else max(0, q_start + shift - left)
    return lo, max(hi, lo)


def _window(causal, window, seqlen_q, seqlen_k):
    """(left, right) as the kernels see it: the one rule of cuflash._attn_common.normalize_window."""
    return normalize_window(causal, (-1, -1) if window is None else window, seqlen_q, seqlen_k)


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False, window=None) -> int:
    """Number of (query, key) pairs the mask allows (bottom-right aligned): the exact score count."""
    w = _window(causal, window, seqlen_q, seqlen_k)
    i = np.arange(seqlen_q, dtype=np.int64)
    lo, hi = _key_range_vec(i, i + 1, seqlen_q, seqlen_k, w)
    return int(np.maximum(hi - lo, 0).sum())


def _key_range_vec(q_start, q_end, seqlen_q, seqlen_k, window):
    shift = seqlen_k - seqlen_q
    left, right = window
    hi = np.full_like(q_start, seqlen_k) if right < 0 else np.minimum(seqlen_k, q_end - 1 + shift + right + 1)
    lo = np.zeros_like(q_start) if left < 0 else np.maximum(0, q_start + shift - left)
    hi = np.maximum(hi, lo)
    return lo, hi


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool = False,
                    window=None, backward: bool = False, schedule: str = "fa2", exact: bool = False) -> int:
    """Matmul FLOPs of attention: forward ``4 * B * H * Sq * Sk * d`` (QK^T and PV, 2 FLOPs per MAC),
    halved for causal (the convention of the FlashAttention benchmarks; ``exact=True`` counts the visible
    pairs instead).

    ``backward=True`` gives forward + backward: the standard schedule's backward is 4 matmuls (dV, dP, dQ, dK:
    total 3x forward); FlashAttention's recomputes S (5 matmuls: total 3.5x forward), Dao 2022 Appendix B.
    """
    if exact:
        pairs = visible_pairs(seqlen_q, seqlen_k, causal, window)
    else:
        pairs = seqlen_q * seqlen_k * (0.5 if causal else 1.0)
    fwd = 4.0 * batch * heads * pairs * head_dim
    if not backward:
        return int(fwd)
    return int(fwd * (3.0 if schedule == "standard" else 3.5))


def attention_bytes(schedule: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                    Br: int | None = None, Bc: int | None = None, dtype="float16", causal: bool = False, *,
                    heads_kv: int | None = None, window=None, score_dtype="float32", return_lse: bool = False,
                    softmax: str = "cached") -> int:
    """HBM bytes of one attention forward under ``schedule`` ("standard", "fa1" or "fa2").

    Per (batch, query head), with s = dtype size, N = seqlen, d = head_dim, T_r = ceil(Sq/Br), T_c = ceil(Sk/Bc):

    ``standard`` (FlashAttention paper, Algorithm 0; cuflash's ``_attention_alt.standard_forward``):
        Q, K, V read once and O written once: ``(2 Sq + 2 Sk) d s``; S = QK^T written, read by the softmax,
        P written, read by PV: ``4 Sq Sk s_S`` with ``s_S`` the score dtype (float32 in cuflash's standard
        path; pass ``score_dtype=dtype`` for the paper's count); a mask (causal/window) applied in HBM adds
        one read + write of S, ``return_lse`` one more read of S, and a softmax method other than
        ``cached`` its extra passes. Theta(N d + N^2) (Theorem 2). Br, Bc are ignored.

    ``fa1`` (FlashAttention, Algorithm 1; cuflash's ``fa1_forward``): K/V tiles outermost. Each K_j, V_j is
        read once (``2 Sk d s``); for every visited (Q tile i, K/V tile j) pair the Q tile is read
        (``Br d s``) and the float32 O_i, m_i, l_i are read (except on the tile's first step) and written
        back (except on its last step, which writes the output in the input dtype and the float32 lse).
        Without masks this is ``2 Sk d s + T_c Sq d s + (T_c - 1) Sq (d + 2) 4 * 2 + Sq d s + 4 Sq``:
        Theta(N^2 d / Bc) = Theta(N^2 d^2 / M) with Bc = Theta(M / d) (Theorem 2).

    ``fa2`` (FlashAttention-2, Algorithm 1): Q tiles outermost. Q read and O written once (``2 Sq d s``),
        the float32 lse written (``4 Sq``), K and V read once per Q tile over its visible key range
        (``2 T_r Sk d s`` without masks). Bc does not enter.

    Masks (``causal`` and ``window=(left, right)``, bottom-right aligned as in FlashAttention >= 2.1) skip the
    tiles that no query of the tile can see (fa1, fa2). ``heads_kv`` (GQA) only changes the standard
    schedule's K/V reads (once per KV head); the tiled schedules read K/V per query head.
    Returns int bytes for the whole batch. Raises ValueError for an unknown schedule, a negative size, tile
    sizes < 1 (or missing for fa1/fa2), window entries < -1.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    B, H, Sq, Sk, d = int(batch), int(heads), int(seqlen_q), int(seqlen_k), int(head_dim)
    Hkv = H if heads_kv is None else int(heads_kv)
    if min(B, H, Sq, Sk, d, Hkv) < 0:
        raise ValueError(f"sizes must be >= 0, got batch {B}, heads {H}, heads_kv {Hkv}, seqlen_q {Sq}, "
                         f"seqlen_k {Sk}, head_dim {d}")
    s = itemsize(dtype)
    w = _window(causal, window, Sq, Sk)
    masked = w != (-1, -1)
    if schedule == "standard":
        ss = itemsize(score_dtype if score_dtype is not None else dtype)
        n2 = Sq * Sk
        per_head = 2 * Sq * d * s + n2 * ss            # read Q, write O; write S
        per_head += (softmax_passes(softmax) - 1) * n2 * ss + n2 * ss  # softmax: read S (passes-1), write P
        per_head += n2 * ss                            # PV reads P
        if masked:
            per_head += 2 * n2 * ss
        if return_lse:
            per_head += n2 * ss + 4 * Sq
        return int(B * (H * per_head + Hkv * 2 * Sk * d * s))
    if Br is None or Bc is None:
        raise ValueError(f"schedule {schedule!r} needs the tile sizes Br and Bc")
    Br, Bc = int(Br), int(Bc)
    if Br < 1 or Bc < 1:
        raise ValueError(f"tile sizes must be >= 1, got Br={Br}, Bc={Bc}")
    Tr = max(math.ceil(Sq / Br), 0)
    i0 = np.arange(Tr, dtype=np.int64) * Br
    i1 = np.minimum(i0 + Br, Sq)
    rows = i1 - i0
    lo, hi = _key_range_vec(i0, i1, Sq, Sk, w)
    if schedule == "fa2":
        per_head = 2 * Sq * d * s + 4 * Sq
        per_head += int((2 * (hi - lo) * d * s).sum())
        return int(B * H * per_head)
    # fa1: tile-granular visited range [jlo, jhi) per Q tile
    jlo = lo // Bc
    jhi = np.where(hi > lo, -(-hi // Bc), jlo)
    steps = np.maximum(jhi - jlo, 0)
    q_reads = int((steps * rows).sum()) * d * s
    state = (d + 2) * ACC_BYTES                     # O_i (float32), m_i, l_i per row
    rw = int((np.maximum(steps - 1, 0) * rows).sum()) * state * 2
    final = Sq * (d * s + 4)                        # output in dtype + lse (also for empty tiles)
    # K_j, V_j: read once per outer step that some tile visits
    Tc = math.ceil(Sk / Bc) if Sk else 0
    used = np.zeros(Tc, dtype=bool)
    for a, b in zip(jlo, jhi):
        used[a:b] = True
    j0 = np.arange(Tc, dtype=np.int64) * Bc
    kv = int((np.minimum(j0 + Bc, Sk) - j0)[used].sum()) * 2 * d * s
    return int(B * H * (q_reads + rw + final + kv))


def theorem2_accesses(schedule: str, seqlen: int, head_dim: int, sram_elems: int) -> float:
    """The asymptotic HBM access counts of the FlashAttention paper's Theorem 2 (elements, constants 1):
    standard ``N d + N^2``; FlashAttention ``N^2 d^2 / M`` for SRAM size ``M`` elements (d <= M <= N d)."""
    N, d, M = float(seqlen), float(head_dim), float(sram_elems)
    if schedule == "standard":
        return N * d + N * N
    if schedule in ("fa1", "fa2", "flash"):
        return N * N * d * d / M
    raise ValueError(f"unknown schedule {schedule!r}")


def fa1_block_sizes_for_sram(sram_elems: int, head_dim: int) -> tuple[int, int]:
    """The paper's tile sizes (Algorithm 1, line 1): Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)."""
    bc = math.ceil(sram_elems / (4 * head_dim))
    return min(bc, head_dim), bc


def attention_min_bytes(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, dtype="float16",
                        heads_kv: int | None = None, lse: bool = True) -> int:
    """The compulsory traffic: read Q, K, V once, write O (and lse) once."""
    s = itemsize(dtype)
    Hkv = heads if heads_kv is None else heads_kv
    return int(batch * (heads * seqlen_q * (2 * head_dim * s + (4 if lse else 0)) + Hkv * 2 * seqlen_k * head_dim * s))


# ----------------------------------------------------------------------------------------------------------
# Reductions and backward passes
def logsumexp_bytes(rows: int, cols: int, dtype, chunks: int = 1, out_dtype=None) -> int:
    """HBM bytes of a row logsumexp (the softmax normaliser alone) over ``rows`` rows of ``cols`` elements.

    The online normaliser (Milakov & Gimelshein 2018, Algorithm 3 without its final pass) reads each element
    once and writes one value per row: ``rows * cols * s_in + rows * s_out``. With ``chunks = K > 1`` (cuflash's
    streaming path for long rows, ``softmax.plan(...).chunks``) every chunk writes its float32 (m, l) state and a
    second launch reads them back: ``+ 2 * rows * K * 8`` bytes.
    """
    s_in = itemsize(dtype)
    s_out = itemsize(out_dtype if out_dtype is not None else dtype)
    k = max(int(chunks), 1)
    total = int(rows) * int(cols) * s_in + int(rows) * s_out
    if k > 1:
        total += 2 * int(rows) * k * 2 * ACC_BYTES
    return int(total)


def norm_backward_bytes(rows: int, hidden: int, dtype, kind: str = "layer", weight: bool = True,
                        weight_dtype=None, blocks: int | None = None) -> int:
    """HBM bytes of the LayerNorm (``kind="layer"``) or RMSNorm (``"rms"``) backward over ``rows x hidden``.

    The gradient (Ba, Kiros & Hinton 2016 for LayerNorm; Zhang & Sennrich 2019 for RMSNorm) needs, per element,
    dy and x (the statistics are saved by the forward) and produces dx: ``3 N s`` (N = rows * hidden). Per row the
    float32 statistics are read (mean and rstd for LayerNorm, rstd for RMSNorm), the weight once:
    ``hidden * s_w``. dweight (and dbias, LayerNorm) are column sums over the rows, reduced in two stages as in
    ``cuflash.norm``: each of ``blocks`` blocks writes a float32 partial row per accumulator, a second kernel
    reads them and writes the final ``hidden`` values: ``(blocks * hidden * 4 * 2 + hidden * s_w)`` per
    accumulator. ``blocks`` defaults to ``min(rows, 1024)`` (cuflash launches up to the resident blocks of the
    GPU; pass the real count when known).
    """
    if kind not in ("layer", "rms"):
        raise ValueError(f"kind must be 'layer' or 'rms', got {kind!r}")
    s = itemsize(dtype)
    sw = itemsize(weight_dtype if weight_dtype is not None else dtype)
    R, h = int(rows), int(hidden)
    nb = min(R, 1024) if blocks is None else int(blocks)
    total = 3 * R * h * s + R * ACC_BYTES * (2 if kind == "layer" else 1)
    nacc = int(bool(weight)) + int(kind == "layer")
    if weight:
        total += h * sw
    total += nacc * (nb * h * ACC_BYTES * 2 + h * sw)
    return int(total)


def _visible_q_rows_per_k_tile(seqlen_q, seqlen_k, Br, Bc, window):
    """Query rows (tile-granular: whole Br-row tiles, clipped to seqlen_q) loaded by each Bc-key tile."""
    Sq, Sk = int(seqlen_q), int(seqlen_k)
    shift = Sk - Sq
    left, right = window
    j0 = np.arange(0, Sk, Bc, dtype=np.int64)
    j1 = np.minimum(j0 + Bc, Sk)
    ilo = np.zeros_like(j0) if right < 0 else np.maximum(0, j0 - shift - right)
    ihi = np.full_like(j0, Sq - 1) if left < 0 else np.minimum(Sq - 1, j1 - 1 - shift + left)
    it0 = ilo // Br * Br
    rows = np.where(ihi >= ilo, np.minimum(Sq, (ihi // Br + 1) * Br) - it0, 0)
    return np.maximum(rows, 0)


def attention_backward_bytes(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, Br: int = 64,
                             Bc: int = 64, dtype="float16", causal: bool = False, *, heads_kv: int | None = None,
                             window=None, deterministic: bool = False) -> int:
    """HBM bytes of the FlashAttention-2 backward as ``cuflash.attention_backward`` runs it (tensor-core path).

    FlashAttention-2 (Dao 2023), Algorithm 2 (and FlashAttention, Dao et al. 2022, Algorithm 4 / Appendix B.2):
    K/V tiles outermost, Q tiles inner, S and P recomputed from the saved lse so no N^2 matrix touches HBM.
    With s = dtype size, d = head_dim, per (batch, query head) unless marked per KV head:

    - preprocess (Alg. 2 line 4: D = rowsum(dO o O)): read O and dO ``2 Sq d s``, read lse ``4 Sq``, write D and
      the safe lse ``8 Sq``; with atomics, zero the float32 dQ accumulator ``4 Sq d``.
    - dK/dV pass: K_j, V_j read once and dK_j, dV_j written once, ``4 Sk d s`` per KV head; for every (K tile j,
      visited Q tile i) Q_i and dO_i are read (``2 Br d s``) with lse_i and D_i (``8 Br``); with atomics
      (default) dQ_i is read and written back in float32 (Alg. 2 line 15: ``2 * 4 Br d``). The Q tiles a K
      tile visits are whole Br-row tiles from the first query row that sees one of its keys (causal / window
      masks bottom-right aligned, as in the kernel), clipped to seqlen_q.
    - atomics: a convert pass reads the accumulator ``4 Sq d`` and writes dQ ``Sq d s``.
      ``deterministic``: instead a dQ pass over Q tiles reads Q_i, dO_i, lse_i, D_i once and K_j, V_j (tiles of
      Br keys) for every visited key tile, and writes dQ ``Sq d s``.

    Without masks and with atomics this is ``Sq (2 d s + 12 + 4 d + 4 d + d s) + Hkv/H * 4 Sk d s
    + T_c Sq (2 d s + 8 + 8 d)`` with T_c = ceil(Sk / Bc): Theta(N^2 d / Bc), the dQ round trips dominating.
    Atomics resolve in L2, so measured DRAM bytes fall far below this count. Returns int bytes for the batch.
    """
    B, H, Sq, Sk, d = int(batch), int(heads), int(seqlen_q), int(seqlen_k), int(head_dim)
    Hkv = H if heads_kv is None else int(heads_kv)
    Br, Bc = int(Br), int(Bc)
    s = itemsize(dtype)
    w = _window(causal, window, Sq, Sk)
    atomic = not deterministic
    per_q = 2 * Sq * d * s + 4 * Sq + 8 * Sq                 # preprocess: O, dO, lse in; D, lse_safe out
    if atomic:
        per_q += Sq * d * ACC_BYTES                          # zero the dQ accumulator
    rows = int(_visible_q_rows_per_k_tile(Sq, Sk, Br, Bc, w).sum())
    per_q += rows * (2 * d * s + 2 * ACC_BYTES)              # Q_i, dO_i, lse_i, D_i per visited tile pair
    if atomic:
        per_q += rows * d * ACC_BYTES * 2                    # dQ_i read-modify-write (float32)
        per_q += Sq * d * ACC_BYTES + Sq * d * s             # convert: accumulator in, dQ out
    else:
        i0 = np.arange(0, Sq, Br, dtype=np.int64)
        i1 = np.minimum(i0 + Br, Sq)
        lo, hi = _key_range_vec(i0, i1, Sq, Sk, w)
        jt0 = lo // Br * Br
        keys = np.where(hi > lo, np.minimum(Sk, -(-hi // Br) * Br) - jt0, 0)
        per_q += Sq * (2 * d * s + 2 * ACC_BYTES)            # Q_i, dO_i, lse_i, D_i once
        per_q += int(keys.sum()) * 2 * d * s                 # K_j, V_j per visited key tile
        per_q += Sq * d * s                                  # dQ out
    per_kv = 4 * Sk * d * s                                  # K, V in; dK, dV out
    return int(B * (H * per_q + Hkv * per_kv))


# ----------------------------------------------------------------------------------------------------------
# Mixed-precision training (cuflash.amp)
def unscale_and_check_bytes(numels, dtypes, write: bool = True) -> int:
    """HBM bytes of ``cuflash.amp.unscale_and_check`` (``write=False``: ``check_finite``) over a list of tensors.

    ``numels``: the element count of each tensor (an int for one tensor); ``dtypes``: one dtype for all, or one
    per tensor (a list of several dtypes runs one launch per dtype; the bytes are the same). Each element is read
    once and, with ``write``, written back once in its own dtype (``g *= inv_scale`` in place)::

        sum_i n_i s_i * (2 if write else 1)  +  24 k

    with ``k`` the number of non-empty tensors (empty ones are not launched): every launch reads its device table
    of int64 (pointer, size, offset) per tensor, ``3 * 8`` bytes each (read by every thread, so it moves from HBM
    once and then hits in cache: negligible beside the data). The int32 ``found_inf`` flag is only stored when a
    non-finite value is seen (4 bytes, not counted: the model is the finite case); allocating a fresh flag is a
    memset outside the kernel. Mixed-precision training: Micikevicius et al. (ICLR 2018), sec. 3.2.
    """
    if isinstance(numels, (int, np.integer)):
        numels = [numels]
    numels = [int(n) for n in numels]
    if isinstance(dtypes, (list, tuple)):
        if len(dtypes) != len(numels):
            raise ValueError(f"{len(dtypes)} dtypes for {len(numels)} tensors")
        sizes = [itemsize(d) for d in dtypes]
    else:
        sizes = [itemsize(dtypes)] * len(numels)
    if any(n < 0 for n in numels):
        raise ValueError(f"element counts must be >= 0, got {numels}")
    data = sum(n * s for n, s in zip(numels, sizes))
    tensors = sum(1 for n in numels if n > 0)
    return int(data * (2 if write else 1) + TABLE_BYTES_PER_TENSOR * tensors)


def sgd_momentum_step_bytes(numel: int, grad_dtype, model_dtype=None, *, momentum: float = 0.9,
                            first_step: bool = False, skip_flag: bool = False, skipped: bool = False) -> int:
    """HBM bytes of ``cuflash.amp.sgd_momentum_step`` over ``numel`` parameters (one pass, in place).

    Per element: the gradient read in its dtype (``s_g``), the float32 master read and written (``4 + 4``), the
    float32 momentum buffer read and written (``4 + 4``; only written on ``first_step``, where ``buf = g``;
    untouched when ``momentum == 0``) and, when ``model_dtype`` is given, the model copy written (``s_m``)::

        numel * (s_g + 8 + [momentum != 0] * (8 - 4 [first_step]) + s_m)  (+ 4 with ``skip_flag``)

    (amp.cu's header: reads G+4+4, writes 4+4+M.) ``skip_flag``: a device ``found_inf`` flag is passed (every
    thread reads the same int32: 4 bytes). ``skipped=True``: the flag was nonzero; every thread reads it and
    returns, so the step moves only those 4 bytes.
    """
    if skipped:  # every thread reads *skip (one word, served once from HBM) and returns
        return FLAG_BYTES
    flag = FLAG_BYTES if skip_flag else 0
    per = itemsize(grad_dtype) + 2 * ACC_BYTES
    if momentum != 0:
        per += ACC_BYTES * (1 if first_step else 2)
    if model_dtype is not None:
        per += itemsize(model_dtype)
    return int(int(numel) * per + flag)


def adamw_step_bytes(numel: int, grad_dtype, model_dtype=None, *, skip_flag: bool = False,
                     skipped: bool = False) -> int:
    """HBM bytes of ``cuflash.amp.adamw_step`` over ``numel`` parameters (one pass, in place).

    Per element: the gradient read in its dtype (``s_g``), the float32 master, exp_avg and exp_avg_sq each read
    and written once (``3 * (4 + 4)``) and, when ``model_dtype`` is given, the model copy written (``s_m``)::

        numel * (s_g + 24 + s_m)  (+ 4 with ``skip_flag``)

    (amp.cu's header: reads G+4+4+4, writes 4+4+4+M; e.g. bf16 gradient and model: 28 bytes per parameter.)
    ``skip_flag`` / ``skipped`` as :func:`sgd_momentum_step_bytes`: a skipped step reads only the 4-byte flag.
    """
    if skipped:  # every thread reads *skip (one word, served once from HBM) and returns
        return FLAG_BYTES
    flag = FLAG_BYTES if skip_flag else 0
    per = itemsize(grad_dtype) + 3 * 2 * ACC_BYTES
    if model_dtype is not None:
        per += itemsize(model_dtype)
    return int(int(numel) * per + flag)


def optimizer_step_flops(numel: int, optimizer: str = "adamw", momentum: float = 0.9, nesterov: bool = False,
                         first_step: bool = False) -> int:
    """FLOPs of a fused optimizer step as amp.cu computes it (fma = 2, sqrt and divide 1 each, per element).

    ``adamw``: 15 (unscale 1, decay 1, m 3, v 4, denominator 3, update 3). ``sgd``: unscale 1, weight decay 2,
    update 2, plus the momentum buffer 3 (0 on ``first_step``, all of it without momentum) and the Nesterov
    correction 2. At ~28 bytes per parameter (bf16 gradient and model) both are far below any GPU's ridge point:
    the steps are bandwidth-bound and their time is their bytes over HBM bandwidth.
    """
    if optimizer == "adamw":
        per = 15
    elif optimizer == "sgd":
        per = 5
        if momentum != 0:
            per += 0 if first_step else 3
            per += 2 if nesterov else 0
    else:
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    return int(numel) * per
