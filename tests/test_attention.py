"""attention(): the FA-2 forward against a float64 reference, by the FlashAttention rule.

The rule (FlashAttention's tests): max |out - ref64| <= 2 * max |base - ref64| + 1e-5, where ``base`` is a
straightforward implementation in the input precision (scores and P rounded to the input dtype, matmuls
accumulated in float32, as cuBLAS does). Each case prints the kernel's and the baseline's max / mean error
before asserting. The float64 reference runs on the GPU with CuPy (same math as cuflash.reference.attention,
checked against it on a small case) so that the large shapes stay fast.
"""
import importlib

import numpy as np
import pytest

from cuflash import _dtypes, reference

from attn_helpers import baseline, randn, ref64

gpu = pytest.mark.gpu
F16, BF16, F32 = _dtypes.float16, _dtypes.bfloat16, _dtypes.float32
DTYPES = [F16, BF16, F32]


# ------------------------------------------------------------------------------------------------ helpers
def check(q, k, v, causal=False, scale=None, window=(-1, -1), what="", lse_check=True, **kw):
    """Run attention, compare with the float64 reference and the same-precision baseline; return (out, lse)."""
    import cupy as cp
    from cuflash.attention import attention

    out, lse = attention(q, k, v, causal=causal, softmax_scale=scale, window_size=window, return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and out.flags.c_contiguous
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    ro, rl = ref64(q, k, v, causal, scale, window)
    bo = baseline(q, k, v, causal, scale, window)
    o64 = out.astype(cp.float64)
    assert not bool(cp.isnan(o64).any()), f"{what}: NaN in output"
    err = cp.abs(o64 - ro)
    berr = cp.abs(bo.astype(cp.float64) - ro)
    e_max, e_mean, b_max, b_mean = (float(x) for x in (err.max(), err.mean(), berr.max(), berr.mean()))
    print(f"{what}: kernel max {e_max:.3e} mean {e_mean:.3e} | baseline max {b_max:.3e} mean {b_mean:.3e}")
    # Per-element floor: one rounding of P to the input dtype before P·V (FlashAttention's tensor-core product;
    # the baseline rounds the normalised P instead) and one of the output, each at most u·sum_j P_ij |v_j|
    # (u the dtype's unit roundoff; ref64 with |v| computes that sum). On a handful of outputs the baseline's
    # max error can fall below a 1-ulp difference by chance (2 keys, 5 queries, bf16: kernel 7.7e-3 against a
    # baseline 3.7e-3 in one H200 run).
    # (Computed only when the plain bound 2 x baseline + 1e-5 fails: a second float64 reference costs time.)
    if e_max > 2 * b_max + 1e-5:
        u = {np.dtype(F16): 2.0 ** -11, np.dtype(BF16): 2.0 ** -8}.get(np.dtype(q.dtype), 2.0 ** -24)
        pv_abs = ref64(q, k, cp.abs(v.astype(cp.float64)), causal, scale, window)[0]
        worst = float((err - (2 * b_max + 1e-5 + 2 * u * pv_abs)).max())
        assert worst <= 0, (f"{what}: max error {e_max:.3e} exceeds 2 x baseline {b_max:.3e} + 1e-5 "
                            f"+ 2u·(P|v|) by {worst:.3e}")
    if lse_check:
        rl_ = rl
        fin = cp.isfinite(rl_)
        assert bool(cp.all(cp.isneginf(lse) == cp.isneginf(rl_))), f"{what}: -inf lse rows differ"
        le = float(cp.abs(cp.where(fin, lse.astype(cp.float64) - rl_, 0.0)).max()) if lse.size else 0.0
        tol = 1e-4 if q.dtype == F32 else 2e-2  # lse of rounded inputs' scores: |s| * eps(dtype) scale
        tol = tol * max(1.0, float(cp.abs(cp.where(fin, rl_, 0.0)).max()) if lse.size else 1.0)
        assert le <= tol, f"{what}: lse error {le:.3e} > {tol:.3e}"
    return out, lse


# ------------------------------------------------------------------------------------------------ CPU tests
def test_declared_tiles_fit_h200_shared_memory():
    A = importlib.import_module("cuflash.attention")

    for d in (32, 64, 96, 128, 256):
        for dt in (F16, BF16):
            for br, bc, w in A.instantiated_tiles(dt, d):
                assert A.smem_bytes(dt, d, br, bc) <= 227 * 1024, (d, dt, br, bc)
                assert br % w == 0 and br // w in (16, 32), (br, w)
        assert A.smem_bytes(F32, d, 0, 0) <= 227 * 1024


def test_declared_names_cover_defaults():
    from cuflash import _compile
    A = importlib.import_module("cuflash.attention")

    names = {n for s, n, e, r in _compile._DECLARED if s == A.SOURCE}
    for (d, causal), cfg in A.DEFAULT_TILES.items():
        for dt in (F16, BF16):
            assert A.kernel_name(dt, d, *cfg) in names
        assert A.kernel_name(F32, d, 0, 0) in names
    assert len(names) <= 40


def test_non_array_input_raises_typeerror():
    from cuflash.attention import attention

    x = np.ones((1, 1, 4, 64), np.float16)
    with pytest.raises(TypeError, match=r"q must be a CuPy array on the GPU, got a host ndarray.*cupy.asarray"):
        attention(x, x, x)
    with pytest.raises(TypeError, match="q must be a CuPy array"):
        attention([1.0], x, x)


def test_argument_parsing_is_strict():
    """causal, window_size and block_sizes take ints / bools only (no silent int() of floats or strings), and a
    window bound of seqlen_q + seqlen_k or more is -1 (unbounded), as the backward always treated it."""
    from cuflash._attn_common import as_bool, normalize_window, parse_block_sizes

    assert normalize_window(False, (3, np.int64(2)), 10, 12) == (3, 2)
    assert normalize_window(False, (22, 21), 10, 12) == (-1, 21)
    assert normalize_window(False, (2**31, 2**40), 10, 12) == (-1, -1)
    assert normalize_window(True, (5, 2**31), 10, 12) == (5, 0)
    for bad in ("12", (1.7, 2.2), (1, "2"), (True, 0), 5):
        with pytest.raises(TypeError, match="window_size"):
            normalize_window(False, bad, 10, 12)
    for bad in ((1, 2, 3), (1,)):
        with pytest.raises(ValueError, match="window_size"):
            normalize_window(False, bad, 10, 12)
    with pytest.raises(ValueError, match=">= -1"):
        normalize_window(False, (-2, 0), 10, 12)
    assert as_bool(True, "causal") is True and as_bool(np.bool_(False), "causal") is False and as_bool(1, "c")
    for bad in ("no", 2, 0.0, None):
        with pytest.raises(TypeError, match="causal"):
            as_bool(bad, "causal")
    assert parse_block_sizes((128, np.int32(64))) == (128, 64)
    assert parse_block_sizes([128, 64, 4], (2, 3)) == (128, 64, 4)
    for bad in ((128.9, 64.2), "garbage", (), (128,), (128, 64, 4), 128, (128, "64")):
        with pytest.raises(ValueError, match="block_sizes"):
            parse_block_sizes(bad)


def test_backward_names_dout_first():
    from cuflash.attention_bwd import attention_backward

    x = np.ones((1, 1, 4, 64), np.float16)
    with pytest.raises(TypeError, match="dout must be a CuPy array"):
        attention_backward(x, x, x, x, x, x)


def test_reference_matches_cpu_reference(rng):
    cp = pytest.importorskip("cupy")
    if not _has_gpu():
        pytest.skip("no GPU for the CuPy float64 reference")
    q = rng.standard_normal((1, 2, 7, 16))
    k = rng.standard_normal((1, 1, 9, 16))
    v = rng.standard_normal((1, 1, 9, 16))
    for causal, win in ((False, (-1, -1)), (True, (-1, -1)), (False, (2, 1))):
        o, l = ref64(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal, None, win)
        ro, rl = reference.attention(q, k, v, causal=causal, window_size=win)
        np.testing.assert_allclose(o.get(), ro, atol=1e-12)
        np.testing.assert_allclose(l.get(), rl, atol=1e-12)


def _has_gpu():
    from cuflash import bench

    return bench.has_gpu()


# ------------------------------------------------------------------------------------------------ GPU tests
SEQLENS = [(1, 1), (1, 239), (113, 203), (127, 513), (1023, 1024), (1024, 1023), (192, 192)]
MASKS = {"full": (False, (-1, -1)), "causal": (True, (-1, -1)), "local": (False, (48, 16))}


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", SEQLENS)
def test_case_attn_tails(cp, rng, dtype, head_dim, causal, sq, sk):
    """cases/attention.json attn-tails: batch 2, heads 3."""
    q = randn(cp, rng, (2, 3, sq, head_dim), dtype)
    k = randn(cp, rng, (2, 3, sk, head_dim), dtype)
    v = randn(cp, rng, (2, 3, sk, head_dim), dtype)
    check(q, k, v, causal, what=f"tails {dtype} d{head_dim} {sq}x{sk} causal={causal}")


HEAD_DIM_CASES = ([(d, m) for d in (32, 64, 96, 128, 256) for m in MASKS] +
                  [(d, m) for d in (1, 17, 40, 80, 100, 160, 255) for m in ("full", "causal")])


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim,mask", HEAD_DIM_CASES)
def test_head_dims(cp, rng, dtype, head_dim, mask):
    """Native head_dims with every mask; non-native ones (zero-padded in the wrapper), odd and even."""
    causal, win = MASKS[mask]
    sq, sk = (113, 203) if head_dim % 2 else (127, 130)
    q = randn(cp, rng, (1, 4, sq, head_dim), dtype)
    k = randn(cp, rng, (1, 2, sk, head_dim), dtype)
    v = randn(cp, rng, (1, 2, sk, head_dim), dtype)
    check(q, k, v, causal, window=win, what=f"d{head_dim} {dtype} {mask}")


@gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("sq,sk", [(1, 239), (300, 77), (257, 700)])
def test_gqa_masks(cp, rng, dtype, hq, hkv, mask, sq, sk):
    causal, win = MASKS[mask]
    q = randn(cp, rng, (2, hq, sq, 64), dtype)
    k = randn(cp, rng, (2, hkv, sk, 64), dtype)
    v = randn(cp, rng, (2, hkv, sk, 64), dtype)
    check(q, k, v, causal, window=win, what=f"{hq}/{hkv} {dtype} {mask} {sq}x{sk}")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_large_2048(cp, rng, dtype, mask, head_dim):
    causal, win = MASKS[mask]
    if mask == "local":
        win = (300, 200)
    q, k, v = (randn(cp, rng, (1, 2, 2048, head_dim), dtype) for _ in range(3))
    check(q, k, v, causal, window=win, what=f"2048 d{head_dim} {dtype} {mask}")


@gpu
@pytest.mark.parametrize("window", [(0, 0), (5, -1), (-1, 3), (200, 0), (1, 1)])
@pytest.mark.parametrize("sq,sk", [(100, 100), (64, 300), (300, 64)])
def test_windows(cp, rng, window, sq, sk):
    q = randn(cp, rng, (1, 2, sq, 128), BF16)
    k, v = (randn(cp, rng, (1, 2, sk, 128), BF16) for _ in range(2))
    check(q, k, v, False, window=window, what=f"window {window} {sq}x{sk}")
    check(q, k, v, True, window=window, what=f"causal window {window} {sq}x{sk}")


@gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_case_causal_sq_gt_sk(cp, rng, dtype):
    """cases attn-causal-sq-gt-sk: rows 0..2 see no key -> exactly 0 and lse -inf."""
    from cuflash.attention import attention

    q = randn(cp, rng, (1, 1, 5, 64), dtype)
    k, v = (randn(cp, rng, (1, 1, 2, 64), dtype) for _ in range(2))
    out, lse = check(q, k, v, True, what=f"sq>sk {dtype}")
    o = out.astype(cp.float32).get()
    assert np.all(o[0, 0, :3] == 0.0)
    assert np.all(np.isneginf(lse.get()[0, 0, :3])) and np.all(np.isfinite(lse.get()[0, 0, 3:]))
    out2 = attention(q, k, v, causal=True)
    assert np.all(np.isfinite(out2.astype(cp.float32).get()))


@gpu
def test_case_causal_sq_lt_sk(cp, rng):
    """cases attn-causal-sq-lt-sk: query 0 sees keys 0..3, query 1 keys 0..4."""
    q = randn(cp, rng, (1, 2, 2, 64), BF16)
    k, v = (randn(cp, rng, (1, 2, 5, 64), BF16) for _ in range(2))
    out, _ = check(q, k, v, True, what="sq<sk")
    # row 0 must NOT see key 4: change v[4] and row 0 stays bitwise equal
    from cuflash.attention import attention

    v2 = v.astype(cp.float32)
    v2[:, :, 4] = v2[:, :, 4] * 3 + 1
    out2 = attention(q, k, v2.astype(BF16), causal=True)
    a, b = out.view(cp.uint16), out2.view(cp.uint16)
    assert bool((a[:, :, 0] == b[:, :, 0]).all()) and not bool((a[:, :, 1] == b[:, :, 1]).all())


@gpu
def test_case_large_logits(cp, rng):
    """cases attn-large-logits: q, k ~ N(0, 1) * 40, scores in the thousands: finite, matches."""
    q = randn(cp, rng, (1, 1, 256, 64), BF16, 40.0)
    k = randn(cp, rng, (1, 1, 256, 64), BF16, 40.0)
    v = randn(cp, rng, (1, 1, 256, 64), BF16)
    out, lse = check(q, k, v, False, what="large logits")
    assert bool(cp.isfinite(out.astype(cp.float32)).all()) and bool(cp.isfinite(lse).all())
    check(q, k, v, True, what="large logits causal")


@gpu
@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_case_deterministic(cp, rng, dtype):
    """cases attn-deterministic-forward: (2, 8, 1000, 128), 20 calls bitwise identical."""
    from cuflash.attention import attention

    q, k, v = (randn(cp, rng, (2, 8, 1000, 128), dtype) for _ in range(3))
    o0, l0 = attention(q, k, v, return_lse=True)
    for causal in (False, True):
        o0, l0 = attention(q, k, v, causal=causal, return_lse=True)
        for _ in range(20):
            o, l = attention(q, k, v, causal=causal, return_lse=True)
            assert bool((o.view(cp.uint16 if dtype != F32 else cp.uint32) ==
                         o0.view(cp.uint16 if dtype != F32 else cp.uint32)).all())
            assert bool((l.view(cp.uint32) == l0.view(cp.uint32)).all())


@gpu
def test_strided_bshd_view(cp, rng):
    """(batch, seqlen, heads, head_dim) storage viewed as (batch, heads, seqlen, head_dim): same result."""
    from cuflash.attention import attention

    qs = randn(cp, rng, (2, 333, 4, 64), F16)
    ks = randn(cp, rng, (2, 250, 2, 64), F16)
    vs = randn(cp, rng, (2, 250, 2, 64), F16)
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (qs, ks, vs))
    assert not q.flags.c_contiguous
    out = check(q, k, v, True, what="bshd view")[0]
    out_c = attention(cp.ascontiguousarray(q), cp.ascontiguousarray(k), cp.ascontiguousarray(v), causal=True)
    assert bool((out.view(cp.uint16) == out_c.view(cp.uint16)).all())


@gpu
@pytest.mark.parametrize("scale", [0.5, -0.3, 0.0])
def test_softmax_scale(cp, rng, scale):
    q, k, v = (randn(cp, rng, (1, 2, 150, 96), BF16) for _ in range(3))
    check(q, k, v, False, scale=scale, what=f"scale {scale}")
    check(q, k, v, True, scale=scale, what=f"causal scale {scale}")


@gpu
def test_padded_head_dim_uses_original_scale(cp, rng):
    """head_dim 40 is padded to 64 but softmax_scale defaults to 1/sqrt(40)."""
    q, k, v = (randn(cp, rng, (1, 1, 70, 40), F16) for _ in range(3))
    check(q, k, v, False, what="d40 default scale")


@gpu
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=str)
def test_extreme_inputs(cp, rng, dtype):
    from cuflash.attention import attention

    # all-equal scores: uniform weights -> mean of v
    q = cp.full((1, 1, 77, 64), 0.5, dtype=cp.float32).astype(dtype)
    k = cp.full((1, 1, 91, 64), 0.5, dtype=cp.float32).astype(dtype)
    v = randn(cp, rng, (1, 1, 91, 64), dtype)
    check(q, k, v, False, what=f"equal scores {dtype}")
    # huge +/- values (near the fp16 range): finite output
    big = 200.0 if dtype == F16 else 1e4
    q = randn(cp, rng, (1, 1, 64, 64), dtype, big)
    k = randn(cp, rng, (1, 1, 64, 64), dtype)
    out = attention(q, k, v[:, :, :64], causal=True)
    assert bool(cp.isfinite(out.astype(cp.float32)).all())
    # NaN in one query row poisons that row only; NaN in a key poisons the rows that see it
    q = randn(cp, rng, (1, 1, 40, 64), dtype)
    k = randn(cp, rng, (1, 1, 40, 64), dtype)
    v = randn(cp, rng, (1, 1, 40, 64), dtype)
    qn = q.astype(cp.float32)
    qn[0, 0, 7, 3] = np.nan
    o, l = attention(qn.astype(dtype), k, v, return_lse=True)
    o = o.astype(cp.float32).get()
    assert np.isnan(o[0, 0, 7]).all() and np.isfinite(np.delete(o[0, 0], 7, axis=0)).all()
    assert np.isnan(l.get()[0, 0, 7])
    kn = k.astype(cp.float32)
    kn[0, 0, 20, 5] = np.nan
    o = attention(q, kn.astype(dtype), v, causal=True).astype(cp.float32).get()
    assert np.isfinite(o[0, 0, :20]).all() and np.isnan(o[0, 0, 20:]).all()


@gpu
def test_one_element_and_fully_masked_tiles(cp, rng):
    from cuflash.attention import attention

    q, k, v = (randn(cp, rng, (1, 1, 1, 32), BF16) for _ in range(3))
    check(q, k, v, True, what="1x1")
    # seqlen_q >> seqlen_k, causal: whole Q tiles see nothing (skip path) -> exact zeros, lse -inf
    q = randn(cp, rng, (1, 2, 700, 64), BF16)
    k, v = (randn(cp, rng, (1, 2, 3, 64), BF16) for _ in range(2))
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    assert bool((out[:, :, :697].astype(cp.float32) == 0).all()) and bool(cp.isneginf(lse[:, :, :697]).all())
    check(q, k, v, True, what="700x3 causal")
    # a window that excludes every key
    q = randn(cp, rng, (1, 1, 50, 64), F16)
    k, v = (randn(cp, rng, (1, 1, 500, 64), F16) for _ in range(2))
    out, lse = attention(q, k, v, window_size=(0, 0), return_lse=True)
    check(q, k, v, False, window=(0, 0), what="window 0,0 sq<sk")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_output_poison_and_empty(cp, rng, dtype):
    """Every output element is written: the memory pool is first filled with NaN (conftest.poison) and freed,
    so out / lse reuse poisoned memory and any element the kernel skips stays NaN."""
    from conftest import poison
    from cuflash.attention import attention

    q, k, v = (randn(cp, rng, (1, 3, 129, 40), dtype) for _ in range(3))
    for causal in (False, True):
        junk = poison(cp.empty(1 << 22, dtype=cp.float32))
        del junk
        o, lse = attention(q, k, v, causal=causal, window_size=(-1, -1) if causal else (30, 3), return_lse=True)
        assert bool(cp.isfinite(o.astype(cp.float32)).all()) and bool(cp.isfinite(lse).all())
    out = attention(q[:, :, :0], k, v)
    assert out.shape == (1, 3, 0, 40)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_instantiated_block_size(cp, rng, head_dim):
    A = importlib.import_module("cuflash.attention")

    q = randn(cp, rng, (1, 2, 333, head_dim), BF16)
    k, v = (randn(cp, rng, (1, 2, 301, head_dim), BF16) for _ in range(2))
    for br, bc, w in A.instantiated_tiles(BF16, head_dim):
        for causal in (False, True):
            check(q, k, v, causal, what=f"Br={br} Bc={bc} warps={w} d{head_dim} causal={causal}",
                  block_sizes=(br, bc, w))


@gpu
def test_bad_inputs_raise(cp):
    from cuflash.attention import attention

    def z(shape, dt=F16):
        return cp.zeros(shape, dtype=dt)

    q = z((2, 4, 8, 64))
    with pytest.raises(ValueError, match="batch"):
        attention(q, z((1, 4, 8, 64)), z((1, 4, 8, 64)))
    with pytest.raises(ValueError, match="head_dim"):
        attention(q, z((2, 4, 8, 32)), z((2, 4, 8, 32)))
    with pytest.raises(ValueError, match="multiple"):
        attention(q, z((2, 3, 8, 64)), z((2, 3, 8, 64)))
    with pytest.raises(ValueError, match="256"):
        attention(z((1, 1, 8, 300)), z((1, 1, 8, 300)), z((1, 1, 8, 300)))
    with pytest.raises(TypeError):
        attention(z((1, 1, 8, 64), cp.float64), z((1, 1, 8, 64), cp.float64), z((1, 1, 8, 64), cp.float64))
    with pytest.raises(TypeError):
        attention(z((1, 1, 8, 64), cp.int32), z((1, 1, 8, 64), cp.int32), z((1, 1, 8, 64), cp.int32))
    with pytest.raises(TypeError):
        attention(q, z((2, 4, 8, 64), BF16), z((2, 4, 8, 64)))
    with pytest.raises(ValueError):
        attention(z((2, 8, 64)), z((2, 8, 64)), z((2, 8, 64)))
    with pytest.raises(ValueError, match="Br=96"):
        attention(q, q, q, block_sizes=(96, 64))
    with pytest.raises(ValueError):
        attention(q, q, q, schedule="fa3")
    q32 = z((1, 1, 8, 64), cp.float32)  # float32 never runs on the wgmma kernel: the message names the device
    with pytest.raises(ValueError, match=r"device \d+ \(compute capability \d+\)"):
        attention(q32, q32, q32, schedule="wgmma")
    with pytest.raises(ValueError):
        attention(q, q, q, window_size=(-2, 0))
    with pytest.raises(TypeError, match="causal"):
        attention(q, q, q, causal="no")
    with pytest.raises(TypeError, match="window_size"):
        attention(q, q, q, window_size=(1.5, 0))
    for schedule in ("standard", "fa2", "fa1"):
        with pytest.raises(ValueError, match="block_sizes"):
            attention(q, q, q, schedule=schedule, block_sizes="garbage")
    # a window bound wider than both sequences is unbounded, never an int32 overflow in the kernel
    qq = cp.asarray(cp.random.standard_normal((1, 2, 40, 64)), dtype=F16)
    ref = attention(qq, qq, qq, window_size=(-1, 0))
    assert bool(cp.all(attention(qq, qq, qq, window_size=(2**31, 0)) == ref))
    ref_c = attention(qq, qq, qq, causal=True)  # (causal may pick other tiles: compare like with like)
    assert bool(cp.all(attention(qq, qq, qq, window_size=(2**40, 2**31 - 1), causal=True) == ref_c))


@gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
def test_alternative_schedules_agree(cp, rng, schedule):
    pytest.importorskip("cuflash._attention_alt")
    q = randn(cp, rng, (1, 4, 200, 64), BF16)
    k, v = (randn(cp, rng, (1, 2, 190, 64), BF16) for _ in range(2))
    for causal in (False, True):
        check(q, k, v, causal, what=f"{schedule} causal={causal}", schedule=schedule)


@pytest.fixture(autouse=True, params=["fa2", "wgmma"])
def auto_kernel(request, monkeypatch):
    """Run every test twice: schedule="auto" on the FA-2 mma.sync kernel, and on the Hopper wgmma kernel
    (where the device is compute capability 9.0; elsewhere that half is skipped)."""
    import importlib

    attn_mod = importlib.import_module("cuflash.attention")  # the module (cuflash.attention is the function)

    if request.param == "wgmma":
        if "gpu" not in request.keywords:
            pytest.skip("CPU test: nothing kernel-specific")
        import cupy

        if cupy.cuda.Device().compute_capability != "90":
            pytest.skip("the wgmma kernel needs compute capability 9.0")
    monkeypatch.setattr(attn_mod, "AUTO_WGMMA", request.param == "wgmma")
    monkeypatch.setattr(attn_mod, "AUTO_WGMMA_MIN_HEAD_DIM", 0)  # every head_dim the wgmma kernel supports
    return request.param
