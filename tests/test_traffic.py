"""CPU tests of the HBM traffic models (cuflash/traffic.py) against hand-computed counts, the FlashAttention
paper's Theorem 2 scaling, and the GPU tables (cuflash/gpus.py)."""
import math

import numpy as np
import pytest

from cuflash import gpus, traffic


@pytest.mark.parametrize("method,passes", [("naive", 3), ("safe", 4), ("online", 3), ("cached", 2)])
@pytest.mark.parametrize("dtype,s", [("float32", 4), ("bfloat16", 2), (np.float16, 2)])
def test_softmax_passes(method, passes, dtype, s):
    rows, cols = 37, 1823
    assert traffic.softmax_bytes(rows, cols, dtype, method) == passes * rows * cols * s


def test_softmax_split_workspace():
    rows, cols, k = 8, 1 << 20, 16
    # chunks on chip: read x once, write y once (float32), write 8*16 (m, l) pairs, every chunk reads all 16
    expect = 2 * rows * cols * 4 + rows * k * 8 + rows * k * k * 8
    assert traffic.softmax_bytes(rows, cols, "float32", "split", splits=k) == expect
    assert traffic.softmax_method("three_pass") == "safe"
    with pytest.raises(ValueError):
        traffic.softmax_method("magic")


def test_norm_bytes():
    rows, h = 1000, 1024
    n = rows * h
    assert traffic.norm_bytes(rows, h, "float32", "rms", weight=False) == 2 * n * 4
    assert traffic.norm_bytes(rows, h, "bfloat16", "layer") == 2 * n * 2 + 2 * h * 2          # weight + bias
    assert traffic.norm_bytes(rows, h, "bfloat16", "rms", residual=True) == 4 * n * 2 + h * 2
    assert traffic.norm_bytes(rows, h, "bfloat16", "rms", residual=True, fused=False) == 5 * n * 2 + h * 2
    assert traffic.norm_bytes(rows, h, "float32", "layer", weight=False, bias=False, save_stats=True) == \
        2 * n * 4 + rows * 8


def test_standard_is_paper_algorithm0():
    """Algorithm 0: read Q, K, V, write O (4 N d) + write S, read S, write P, read P (4 N^2), per head."""
    B, H, N, d = 2, 3, 1000, 64
    got = traffic.attention_bytes("standard", B, H, N, N, d, None, None, "float16", False, score_dtype="float16")
    assert got == B * H * (4 * N * d * 2 + 4 * N * N * 2)
    # cuflash's standard keeps S and P in float32; a mask adds a read + write of S; lse one more read of S
    f32 = traffic.attention_bytes("standard", B, H, N, N, d, None, None, "float16", False)
    assert f32 == B * H * (4 * N * d * 2 + 4 * N * N * 4)
    c = traffic.attention_bytes("standard", B, H, N, N, d, None, None, "float16", True, return_lse=True)
    assert c == f32 + B * H * (3 * N * N * 4 + 4 * N)
    # GQA: K and V read once per KV head
    g = traffic.attention_bytes("standard", B, 4, N, N, d, None, None, "float16", False, heads_kv=1)
    full = traffic.attention_bytes("standard", B, 4, N, N, d, None, None, "float16", False)
    assert full - g == B * 3 * 2 * N * d * 2


def test_standard_quadratic_term():
    """Theta(N d + N^2): doubling N with d fixed multiplies the bytes by ~4 at large N."""
    a = traffic.attention_bytes("standard", 1, 1, 8192, 8192, 64, None, None, "bfloat16", False)
    b = traffic.attention_bytes("standard", 1, 1, 16384, 16384, 64, None, None, "bfloat16", False)
    assert 3.9 < b / a <= 4.0


def test_fa1_hand_count():
    B, H, N, d, Br, Bc, s = 2, 2, 1000, 64, 64, 128, 2
    Tc = math.ceil(N / Bc)
    expect = (2 * N * d * s                        # K, V once
              + Tc * N * d * s                     # Q_i re-read every outer step
              + 2 * (Tc - 1) * N * (d + 2) * 4     # O_i, m_i, l_i read + written back (float32) between steps
              + N * (d * s + 4))                   # output and lse on the last step
    assert traffic.attention_bytes("fa1", B, H, N, N, d, Br, Bc, "float16", False) == B * H * expect


def test_fa2_hand_count():
    B, H, N, d, Br, Bc, s = 1, 4, 1000, 128, 128, 64, 2
    Tr = math.ceil(N / Br)
    expect = 2 * N * d * s + 4 * N + Tr * 2 * N * d * s
    assert traffic.attention_bytes("fa2", B, H, N, N, d, Br, Bc, "bfloat16", False) == B * H * expect
    # Bc does not enter the FA-2 count
    assert traffic.attention_bytes("fa2", B, H, N, N, d, Br, 32, "bfloat16", False) == B * H * expect


def test_causal_halves_the_tiled_kv_traffic():
    N, d = 16384, 128
    full = traffic.attention_bytes("fa2", 1, 1, N, N, d, 128, 64, "bfloat16", False)
    causal = traffic.attention_bytes("fa2", 1, 1, N, N, d, 128, 64, "bfloat16", True)
    assert 0.49 < causal / full < 0.53
    f1 = traffic.attention_bytes("fa1", 1, 1, N, N, d, 64, 64, "bfloat16", False)
    c1 = traffic.attention_bytes("fa1", 1, 1, N, N, d, 64, 64, "bfloat16", True)
    assert 0.49 < c1 / f1 < 0.53


def test_theorem2_scaling():
    """FlashAttention's HBM accesses are Theta(N^2 d^2 / M) with the paper's tiles Bc = ceil(M / 4d),
    Br = min(Bc, d): the model over N^2 d^2 / M is ~constant in N and in M, and far below standard's N^2."""
    d = 64
    ratios = []
    for M, N in [(16384, 8192), (16384, 16384), (32768, 16384), (8192, 16384)]:
        br, bc = traffic.fa1_block_sizes_for_sram(M, d)
        elems = traffic.attention_bytes("fa1", 1, 1, N, N, d, br, bc, "float32", False) / 4
        ratios.append(elems / traffic.theorem2_accesses("fa1", N, d, M))
    print("model / (N^2 d^2 / M):", ratios)
    assert max(ratios) / min(ratios) < 1.35
    N, M = 16384, 100 * 1024 // 4
    br, bc = traffic.fa1_block_sizes_for_sram(M, d)
    std = traffic.attention_bytes("standard", 1, 1, N, N, d, None, None, "float32", False, score_dtype="float32")
    fa1 = traffic.attention_bytes("fa1", 1, 1, N, N, d, br, bc, "float32", False)
    assert std / fa1 > 1.5     # ~ 4 Bc / (3 d) with float32 O round trips
    assert traffic.theorem2_accesses("standard", N, d, M) == N * d + N * N


def test_fa1_bytes_fall_with_block_size():
    """Fig. 2 (right) of the paper: HBM accesses fall as the block grows."""
    vals = [traffic.attention_bytes("fa1", 64, 16, 1024, 1024, 64, 64, bc, "float16", False)
            for bc in (16, 32, 64, 128, 256)]
    assert all(a > b for a, b in zip(vals, vals[1:]))


def test_visible_pairs_and_flops():
    assert traffic.visible_pairs(5, 5, causal=True) == 15
    assert traffic.visible_pairs(5, 2, causal=True) == 3          # bottom-right: rows 3, 4 see 1 and 2 keys
    assert traffic.visible_pairs(2, 5, causal=True) == 4 + 5
    assert traffic.visible_pairs(6, 6, window=(1, 1)) == 16
    f = traffic.attention_flops(64, 16, 1024, 1024, 64)
    assert f == 4 * 64 * 16 * 1024 * 1024 * 64
    assert traffic.attention_flops(64, 16, 1024, 1024, 64, backward=True, schedule="standard") == 3 * f
    assert traffic.attention_flops(64, 16, 1024, 1024, 64, causal=True) == f // 2


def test_bad_schedule():
    with pytest.raises(ValueError):
        traffic.attention_bytes("fa3", 1, 1, 8, 8, 8, 8, 8, "float16", False)
    with pytest.raises(ValueError):
        traffic.attention_bytes("fa1", 1, 1, 8, 8, 8, None, None, "float16", False)


def test_gpu_tables():
    h200 = gpus.get("NVIDIA H200")
    assert h200.copy_GBps() == 4108.0 and h200.matmul_TFLOPs("bfloat16") == 752.0
    assert gpus.get("H100").hbm_GBps == 3350.0 and gpus.get("A100").sms == 108
    assert h200.matmul_TFLOPs("float32") == h200.fp32_TFLOPs
    t = gpus.predict_time_s(4108e9, 0, "H200")
    assert abs(t - 1.0) < 1e-9
    assert gpus.predict_time_s(0, 752e12, "H200") == pytest.approx(1.0)
    with pytest.raises(ValueError):
        gpus.get("Voodoo2")


# ----------------------------------------------------------------------------------------------------------
# logsumexp, norm backward, attention backward
def test_logsumexp_bytes():
    rows, cols = 37, 1823
    assert traffic.logsumexp_bytes(rows, cols, "float32") == rows * cols * 4 + rows * 4     # one read pass
    assert traffic.logsumexp_bytes(rows, cols, "bfloat16") == rows * cols * 2 + rows * 2
    # streaming path: K float32 (m, l) states per row written, then read by the finalize launch
    assert traffic.logsumexp_bytes(rows, cols, "float32", chunks=5) == rows * cols * 4 + rows * 4 + 2 * rows * 5 * 8


def test_norm_backward_bytes():
    rows, h, nb = 1000, 1024, 132
    n = rows * h
    # LayerNorm bf16, bf16 weight: dy, x in, dx out; mean + rstd; weight; dW and dB partials (float32) + finals
    assert traffic.norm_backward_bytes(rows, h, "bfloat16", "layer", blocks=nb) == \
        3 * n * 2 + rows * 8 + h * 2 + 2 * (nb * h * 4 * 2 + h * 2)
    # RMSNorm float32 weight: rstd only, one accumulator
    assert traffic.norm_backward_bytes(rows, h, "bfloat16", "rms", weight_dtype="float32", blocks=nb) == \
        3 * n * 2 + rows * 4 + h * 4 + (nb * h * 4 * 2 + h * 4)
    # no weight: LayerNorm still sums dbias
    assert traffic.norm_backward_bytes(rows, h, "float32", "layer", weight=False, blocks=nb) == \
        3 * n * 4 + rows * 8 + (nb * h * 4 * 2 + h * 4)
    assert traffic.norm_backward_bytes(rows, h, "float32", "rms") == \
        traffic.norm_backward_bytes(rows, h, "float32", "rms", blocks=1000)   # default min(rows, 1024)
    with pytest.raises(ValueError):
        traffic.norm_backward_bytes(rows, h, "float32", "batch")


def test_attention_backward_hand_count():
    """FA-2 Algorithm 2 without masks: K/V tiles outermost, every K tile reads all of Q, dO (and lse, D) and, with
    atomics, reads + writes the float32 dQ; deterministic: a dQ pass re-reads K, V once per Q tile instead."""
    B, H, N, d, Br, Bc, s = 2, 3, 1000, 64, 64, 128, 2
    Tc, Tr = math.ceil(N / Bc), math.ceil(N / Br)
    pre = 2 * N * d * s + 4 * N + 8 * N
    per_kv = 4 * N * d * s
    atomic = pre + N * d * 4 + Tc * N * (2 * d * s + 8 + 8 * d) + N * d * 4 + N * d * s
    got = traffic.attention_backward_bytes(B, H, N, N, d, Br, Bc, "float16")
    assert got == B * H * (atomic + per_kv)
    det = pre + Tc * N * (2 * d * s + 8) + N * (2 * d * s + 8) + Tr * N * 2 * d * s + N * d * s
    assert traffic.attention_backward_bytes(B, H, N, N, d, Br, Bc, "float16", deterministic=True) == \
        B * H * (det + per_kv)
    # GQA: K, V, dK, dV once per KV head
    g = traffic.attention_backward_bytes(B, 4, N, N, d, Br, Bc, "float16", heads_kv=1)
    assert traffic.attention_backward_bytes(B, 4, N, N, d, Br, Bc, "float16") - g == B * 3 * per_kv
    # the dQ round trips make the backward Theta(N^2 d / Bc): doubling Bc nearly halves the pair term
    big = [traffic.attention_backward_bytes(1, 1, 16384, 16384, 128, 64, bc, "bfloat16") for bc in (64, 128)]
    assert 0.5 < big[1] / big[0] < 0.55


def _brute_rows_per_k_tile(Sq, Sk, Br, Bc, causal, window):
    """Query rows each K tile loads, from the mask itself: the Br-row tiles from the first to the last query row
    that sees a key of the tile (bottom-right aligned), clipped to Sq."""
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    shift = Sk - Sq
    ok = np.ones((Sq, Sk), bool)
    if right >= 0:
        ok &= j <= i + shift + right
    if left >= 0:
        ok &= j >= i + shift - left
    out = []
    for j0 in range(0, Sk, Bc):
        rows = np.nonzero(ok[:, j0:j0 + Bc].any(axis=1))[0]
        out.append(0 if rows.size == 0 else min(Sq, (rows.max() // Br + 1) * Br) - rows.min() // Br * Br)
    return np.array(out)


@pytest.mark.parametrize("Sq,Sk,causal,window", [(300, 300, True, None), (200, 333, True, None),
                                                 (333, 200, True, None), (256, 256, False, (40, 10)),
                                                 (190, 250, False, (-1, 30)), (250, 190, True, (64, -1))])
def test_attention_backward_mask_ranges(Sq, Sk, causal, window):
    Br, Bc = 64, 32
    got = traffic._visible_q_rows_per_k_tile(Sq, Sk, Br, Bc, traffic._window(causal, window, Sq, Sk))
    want = _brute_rows_per_k_tile(Sq, Sk, Br, Bc, causal, window)
    assert got.tolist() == want.tolist()


def test_attention_backward_causal_halves_the_pair_term():
    N, d = 16384, 128
    full = traffic.attention_backward_bytes(1, 1, N, N, d, 64, 64, "bfloat16")
    causal = traffic.attention_backward_bytes(1, 1, N, N, d, 64, 64, "bfloat16", True)
    assert 0.49 < causal / full < 0.53


# ----------------------------------------------------------------------------------------------------------
# Mixed-precision training kernels (cuflash.amp)
def test_unscale_and_check_bytes():
    # one bf16 tensor of 1000 elements: read + write 2 bytes each, one 24-byte table entry (ptr, size, offset)
    assert traffic.unscale_and_check_bytes(1000, "bfloat16") == 1000 * 2 * 2 + 24
    assert traffic.unscale_and_check_bytes(1000, "float32") == 1000 * 4 * 2 + 24
    assert traffic.unscale_and_check_bytes([1000], np.float16, write=False) == 1000 * 2 + 24   # check_finite
    # a mixed list (two launches, one per dtype); the empty tensor is not launched (no table entry)
    numels, dts = [300, 7, 0, 50], ["bfloat16", "float32", "float16", "float32"]
    data = 300 * 2 + 7 * 4 + 0 * 2 + 50 * 4
    assert traffic.unscale_and_check_bytes(numels, dts) == 2 * data + 3 * 24
    assert traffic.unscale_and_check_bytes(numels, dts, write=False) == data + 3 * 24
    # one dtype for the whole list
    assert traffic.unscale_and_check_bytes([3, 5], "float32") == 2 * 8 * 4 + 2 * 24
    assert traffic.unscale_and_check_bytes([], "float32") == 0
    with pytest.raises(ValueError):
        traffic.unscale_and_check_bytes([1, 2], ["float32"])
    with pytest.raises(ValueError):
        traffic.unscale_and_check_bytes([-1], "float32")


@pytest.mark.parametrize("grad,sg", [("float32", 4), ("float16", 2), ("bfloat16", 2)])
@pytest.mark.parametrize("model,sm", [(None, 0), ("float16", 2), ("bfloat16", 2), ("float32", 4)])
def test_optimizer_step_bytes(grad, sg, model, sm):
    n = 1001
    # SGD with momentum: grad in; master in + out; buffer in + out; model copy out
    assert traffic.sgd_momentum_step_bytes(n, grad, model) == n * (sg + 4 + 4 + 4 + 4 + sm)
    assert traffic.sgd_momentum_step_bytes(n, grad, model, first_step=True) == n * (sg + 4 + 4 + 4 + sm)  # buf = g
    assert traffic.sgd_momentum_step_bytes(n, grad, model, momentum=0.0) == n * (sg + 4 + 4 + sm)     # no buffer
    # AdamW: grad in; master, exp_avg, exp_avg_sq in + out; model copy out
    assert traffic.adamw_step_bytes(n, grad, model) == n * (sg + 3 * (4 + 4) + sm)
    # a device skip flag adds one int32 read; a skipped step moves only that flag
    assert traffic.adamw_step_bytes(n, grad, model, skip_flag=True) == n * (sg + 24 + sm) + 4
    assert traffic.sgd_momentum_step_bytes(n, grad, model, skip_flag=True) == n * (sg + 16 + sm) + 4
    assert traffic.adamw_step_bytes(n, grad, model, skipped=True) == 4
    assert traffic.sgd_momentum_step_bytes(n, grad, model, skipped=True) == 4


def test_amp_step_bytes_typical():
    """The usual recipe: bf16 gradient and model copy, fp32 master and state: AdamW 28 B, SGD 20 B a parameter."""
    n = 64 << 20
    assert traffic.adamw_step_bytes(n, "bfloat16", "bfloat16") == 28 * n
    assert traffic.sgd_momentum_step_bytes(n, "bfloat16", "bfloat16") == 20 * n
    assert traffic.unscale_and_check_bytes([n // 2, n // 2], "bfloat16") == 4 * n + 48


def test_optimizer_step_flops():
    assert traffic.optimizer_step_flops(10, "adamw") == 150
    assert traffic.optimizer_step_flops(10, "sgd") == 80
    assert traffic.optimizer_step_flops(10, "sgd", nesterov=True) == 100
    assert traffic.optimizer_step_flops(10, "sgd", first_step=True) == 50
    assert traffic.optimizer_step_flops(10, "sgd", momentum=0.0, nesterov=True) == 50
    with pytest.raises(ValueError):
        traffic.optimizer_step_flops(10, "lamb")


def test_attention_bytes_refuses_impossible_inputs():
    """Negative sizes, zero tiles and windows below -1 raise ValueError (they returned negative byte counts or
    divided by zero)."""
    for bad in (dict(seqlen_q=-5), dict(batch=-1), dict(head_dim=-64), dict(heads_kv=-2)):
        args = dict(batch=1, heads=1, seqlen_q=128, seqlen_k=64, head_dim=64) | bad
        with pytest.raises(ValueError, match=">= 0"):
            traffic.attention_bytes("fa2", Br=64, Bc=64, **args)
    with pytest.raises(ValueError, match="tile sizes"):
        traffic.attention_bytes("fa2", 1, 1, 128, 128, 64, 0, 64)
    with pytest.raises(ValueError, match=">= -1"):
        traffic.attention_bytes("fa1", 1, 1, 128, 128, 64, 64, 64, window=(-2, 0))
    assert traffic.attention_bytes("fa2", 1, 1, 0, 128, 64, 64, 64) == 0
