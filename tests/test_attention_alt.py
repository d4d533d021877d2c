"""The FA-1 and standard attention schedules (cuflash/_attention_alt.py, cuda_src/attention_fa1.cu).

CPU: a NumPy emulation of the FA-1 kernel's exact schedule (outer K/V steps, per-tile first/last/skip logic,
normalised O as in Algorithm 1 line 12, -inf guards) checked against the float64 reference on masks, tails and
empty rows, and its byte count checked against traffic.attention_bytes("fa1").
GPU: fa1 and standard via ``attention(..., schedule=...)`` against ``reference.attention`` with the error of a
same-precision straightforward implementation printed next to the kernel's (FlashAttention rule: <= 2x it plus
a small floor).
"""
import math

import numpy as np
import pytest

from conftest import poison

from cuflash import _dtypes, reference, traffic

DTYPES = [np.float16, _dtypes.bfloat16, np.float32]


# ----------------------------------------------------------------------------------------------------------
# CPU emulation of the kernel's schedule
def fa1_emulate(q, k, v, scale, window, Br, Bc):
    """q (Sq, D), k/v (Sk, D) float64; returns out, lse, bytes moved (elements of 2-byte inputs)."""
    Sq, D = q.shape
    Sk = k.shape[0]
    shift = Sk - Sq
    left, right = window
    Tr, Tc = math.ceil(Sq / Br), math.ceil(Sk / Bc)
    O = np.full((Sq, D), np.nan)
    m = np.full(Sq, np.nan)
    l = np.full(Sq, np.nan)
    out = np.full((Sq, D), np.nan)
    lse = np.full(Sq, np.nan)
    nbytes = 0
    s_in = 2
    kv_used = set()
    for j in range(Tc):                                   # outer loop: one launch per K/V tile
        for i in range(Tr):                               # the launch's blocks
            q0, q1 = i * Br, min(i * Br + Br, Sq)
            hi = Sk if right < 0 else min(Sk, q1 - 1 + shift + right + 1)
            lo = 0 if left < 0 else max(0, q0 + shift - left)
            if hi <= lo:
                if j == 0:
                    out[q0:q1] = 0
                    lse[q0:q1] = -np.inf
                    nbytes += (q1 - q0) * (D * s_in + 4)
                continue
            jlo, jhi = lo // Bc, (hi + Bc - 1) // Bc
            if j < jlo or j >= jhi:
                continue
            first, last = j == jlo, j == jhi - 1
            k0 = j * Bc
            kv_used.add(j)
            nbytes += (q1 - q0) * D * s_in
            qi = np.arange(q0, q1)[:, None]
            kj = np.arange(k0, min(k0 + Bc, Sk))[None, :]
            ok = np.ones((q1 - q0, kj.shape[1]), bool)
            if right >= 0:
                ok &= kj <= qi + shift + right
            if left >= 0:
                ok &= kj >= qi + shift - left
            s = np.where(ok, q[q0:q1] @ k[k0:k0 + Bc].T * scale, -np.inf)
            mt = s.max(axis=1)
            p = np.where(s == -np.inf, 0.0, np.exp(s - np.where(np.isinf(mt), 0, mt)[:, None]))
            lt = p.sum(axis=1)
            if first:
                mi, li, Oi = np.full(q1 - q0, -np.inf), np.zeros(q1 - q0), np.zeros((q1 - q0, D))
            else:
                mi, li, Oi = m[q0:q1], l[q0:q1], O[q0:q1]
                nbytes += (q1 - q0) * (D + 2) * 4
            mn = np.maximum(mi, mt)
            with np.errstate(invalid="ignore"):
                ea = np.where(np.isneginf(mi), 0.0, np.exp(mi - mn))
                eb = np.where(np.isneginf(mt), 0.0, np.exp(mt - mn))
            ln = np.where(np.isneginf(mn), 0.0, ea * li + eb * lt)
            with np.errstate(divide="ignore", invalid="ignore"):
                alpha = np.where(ln > 0, ea * li / ln, 0.0)
                beta = np.where(ln > 0, eb / ln, 0.0)
            On = np.where(alpha[:, None] == 0, 0.0, alpha[:, None] * Oi) + beta[:, None] * (p @ v[k0:k0 + Bc])
            if last:
                out[q0:q1] = On
                with np.errstate(divide="ignore"):
                    lse[q0:q1] = np.where(ln > 0, mn + np.log(np.where(ln > 0, ln, 1)), -np.inf)
                nbytes += (q1 - q0) * (D * s_in + 4)
            else:
                O[q0:q1], m[q0:q1], l[q0:q1] = On, mn, ln
                nbytes += (q1 - q0) * (D + 2) * 4
    for j in kv_used:
        nbytes += 2 * (min(j * Bc + Bc, Sk) - j * Bc) * D * s_in
    return out, lse, nbytes


SHAPES = [(1, 1), (1, 239), (113, 203), (127, 513), (203, 113), (192, 192), (5, 2), (2, 5)]
WINDOWS = [(False, (-1, -1)), (True, (-1, -1)), (False, (16, 8)), (True, (40, -1))]


@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("causal,window", WINDOWS)
@pytest.mark.parametrize("br,bc", [(16, 16), (64, 32), (32, 64)])
def test_fa1_schedule_emulation(rng, sq, sk, causal, window, br, bc):
    d = 24
    q = rng.standard_normal((1, 1, sq, d))
    k = rng.standard_normal((1, 1, sk, d))
    v = rng.standard_normal((1, 1, sk, d))
    scale = 1 / math.sqrt(d)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, softmax_scale=scale, window_size=window)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    out, lse, nbytes = fa1_emulate(q[0, 0], k[0, 0], v[0, 0], scale, (left, right), br, bc)
    assert not np.isnan(out).any() and not np.isnan(lse).any(), "some row was never written"
    np.testing.assert_allclose(out, ref[0, 0], atol=1e-12, rtol=1e-10)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse[0, 0]))
    fin = np.isfinite(ref_lse[0, 0])
    np.testing.assert_allclose(lse[fin], ref_lse[0, 0][fin], rtol=1e-12, atol=1e-12)
    model = traffic.attention_bytes("fa1", 1, 1, sq, sk, d, br, bc, "float16", causal, window=window)
    assert nbytes == model


# ----------------------------------------------------------------------------------------------------------
# GPU
def _attention():
    import cuflash

    return cuflash.attention


def _to_dev(cp, a, dtype):
    return cp.asarray(a.astype(np.float32).astype(dtype))


def _baseline(qh, kh, vh, causal, scale, window, dtype):
    """Straightforward same-precision attention: inputs in dtype, float32 S/softmax, P rounded to dtype, float32
    P.V, output rounded to dtype (what a framework's unfused path does)."""
    q, k, v = (np.asarray(a).astype(np.float32) for a in (qh, kh, vh))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.matmul(q, k.swapaxes(-1, -2)).astype(np.float32) * np.float32(scale)
    allowed = reference.attention_mask(q.shape[2], k.shape[2], causal, window)
    s = np.where(allowed, s, -np.inf).astype(np.float32)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isinf(m), 0, m)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = (p / np.where(l == 0, 1, l)).astype(dtype).astype(np.float32)
    o = np.matmul(p, v).astype(np.float32)
    return o.astype(dtype)


def _check(schedule, cp, rng, dtype, B, Hq, Hkv, sq, sk, d, causal=False, window=(-1, -1), block_sizes=None,
           amp=1.0, transpose=False):
    attention = _attention()
    qn = (rng.standard_normal((B, Hq, sq, d)) * amp).astype(np.float32).astype(dtype)
    kn = (rng.standard_normal((B, Hkv, sk, d)) * amp).astype(np.float32).astype(dtype)
    vn = rng.standard_normal((B, Hkv, sk, d)).astype(np.float32).astype(dtype)
    if transpose:   # (B, S, H, D) storage viewed as (B, H, S, D)
        q, k, v = (cp.ascontiguousarray(cp.asarray(a).transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
                   for a in (qn, kn, vn))
    else:
        q, k, v = cp.asarray(qn), cp.asarray(kn), cp.asarray(vn)
    kw = dict(causal=causal, window_size=window, return_lse=True, schedule=schedule)
    if block_sizes is not None:
        kw["block_sizes"] = block_sizes
    # poison: hand the pool blocks full of NaN of the output sizes, so elements a kernel never writes show up
    junk = [poison(cp.empty((B, Hq, sq, d), dtype=np.float32 if np.dtype(dtype).itemsize == 4 else np.float16)),
            poison(cp.empty((B, Hq, sq), dtype=np.float32))]
    del junk
    out, lse = attention(q, k, v, **kw)
    assert out.shape == (B, Hq, sq, d) and out.dtype == np.dtype(dtype)
    assert lse.shape == (B, Hq, sq) and lse.dtype == np.float32
    scale = 1 / math.sqrt(d)
    ref, ref_lse = reference.attention(qn, kn, vn, causal=causal, softmax_scale=scale, window_size=window)
    base = _baseline(qn, kn, vn, causal, scale, window, dtype)
    from cuflash import bench

    e = bench.errors(out, ref)
    eb = bench.errors(base, ref)
    el = bench.errors(lse, ref_lse)
    print(f"{schedule} {np.dtype(dtype)} B{B} H{Hq}/{Hkv} {sq}x{sk} d{d} causal={causal} win={window} "
          f"tiles={block_sizes}: max abs {e['max_abs_err']:.3g} mean {e['mean_abs_err']:.3g} | baseline max "
          f"{eb['max_abs_err']:.3g} mean {eb['mean_abs_err']:.3g} | lse max abs {el['max_abs_err']:.3g}")
    assert e["nonfinite_mismatch"] == 0 and el["nonfinite_mismatch"] == 0
    assert e["max_abs_err"] <= 2 * eb["max_abs_err"] + 1e-5
    lse_tol = 1e-4 * max(1.0, float(np.nanmax(np.abs(np.where(np.isfinite(ref_lse), ref_lse, 0)))))
    assert el["max_abs_err"] <= lse_tol
    # fully masked rows: exactly 0 and -inf
    dead = np.isneginf(ref_lse)
    if dead.any():
        o = out.get().astype(np.float32)
        assert (o[dead] == 0).all()
        assert np.isneginf(lse.get()[dead]).all()
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 239), (113, 203), (127, 513), (1023, 1024), (1024, 1023), (192, 192)])
@pytest.mark.parametrize("causal", [False, True])
def test_tails(cp, rng, schedule, dtype, sq, sk, causal):
    big = sq * sk > 300_000   # keep the float64 reference cheap
    _check(schedule, cp, rng, dtype, 1 if big else 2, 1 if big else 3, 1 if big else 3, sq, sk, 64, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1, 40, 72, 128, 256])
def test_head_dims(cp, rng, schedule, dtype, d):
    _check(schedule, cp, rng, dtype, 1, 2, 2, 177, 301, d, causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
@pytest.mark.parametrize("dtype", [np.float16, _dtypes.bfloat16])
def test_causal_sq_gt_sk_rows_see_nothing(cp, rng, schedule, dtype):
    """attn-causal-sq-gt-sk: q (1, 1, 5, 64), k/v (1, 1, 2, 64): rows 0-2 output 0 and lse -inf."""
    out = _check(schedule, cp, rng, dtype, 1, 1, 1, 5, 2, 64, causal=True)
    assert (out.get()[0, 0, :3].astype(np.float32) == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
def test_causal_sq_lt_sk_bottom_right(cp, rng, schedule):
    _check(schedule, cp, rng, _dtypes.bfloat16, 1, 2, 2, 2, 5, 64, causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
@pytest.mark.parametrize("hq,hkv", [(6, 2), (4, 1), (3, 3)])
def test_gqa(cp, rng, schedule, hq, hkv):
    _check(schedule, cp, rng, np.float16, 2, hq, hkv, 130, 257, 64, causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
@pytest.mark.parametrize("causal,window", [(False, (16, 8)), (True, (40, -1)), (False, (0, 0)), (False, (-1, 3))])
def test_windows(cp, rng, schedule, causal, window):
    _check(schedule, cp, rng, _dtypes.bfloat16, 1, 2, 2, 211, 190, 64, causal=causal, window=window)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
def test_large_logits_and_strided_views(cp, rng, schedule):
    _check(schedule, cp, rng, _dtypes.bfloat16, 1, 2, 2, 256, 256, 64, amp=40.0)
    _check(schedule, cp, rng, np.float16, 2, 4, 2, 100, 300, 64, causal=True, transpose=True)


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [(16, 16), (32, 32), (64, 16), (64, 32), (64, 64), (64, 128), (64, 256),
                                   (128, 64)])
def test_fa1_every_tile(cp, rng, tiles):
    _check("fa1", cp, rng, np.float16, 1, 2, 1, 333, 517, 64, causal=True, block_sizes=tiles)
    _check("fa1", cp, rng, np.float32, 1, 1, 1, 70, 1000, 40, block_sizes=tiles)


@pytest.mark.gpu
def test_fa1_bad_tiles(cp):
    attention = _attention()
    q = cp.ones((1, 1, 8, 64), dtype=np.float16)
    with pytest.raises(ValueError):
        attention(q, q, q, schedule="fa1", block_sizes=(48, 48))


@pytest.mark.gpu
def test_fa1_matches_model_launch_count(cp, rng):
    """Tc launches, one per outer step: equal outputs whatever the tile, and no NaN from uninitialised buffers."""
    attention = _attention()
    q = cp.asarray(rng.standard_normal((1, 2, 300, 64)).astype(np.float16))
    a = attention(q, q, q, schedule="fa1", block_sizes=(16, 16)).get().astype(np.float32)
    b = attention(q, q, q, schedule="fa1", block_sizes=(64, 256)).get().astype(np.float32)
    assert np.isfinite(a).all() and np.abs(a - b).max() < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["fa1", "standard"])
def test_deterministic_forward(cp, rng, schedule):
    """attn-deterministic-forward (smaller): output and lse bitwise identical over repeated calls."""
    attention = _attention()
    q, k, v = (cp.asarray(rng.standard_normal((2, 8, 300, 128)).astype(np.float32).astype(_dtypes.bfloat16))
               for _ in range(3))
    o0, l0 = attention(q, k, v, schedule=schedule, return_lse=True)
    for _ in range(5):
        o, l = attention(q, k, v, schedule=schedule, return_lse=True)
        assert (o.view(cp.uint16) == o0.view(cp.uint16)).all()
        assert cp.array_equal(l, l0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_nonfinite_inputs_alike_on_every_schedule(cp, rng, dtype):
    """NaN / inf in q and k reach the same outputs and lse on every schedule (attention's docstring): a NaN in q
    its row, a NaN or inf in k the rows that see that key, and no other row (masked ones included); with
    softmax_scale=0 too. Found by experiments/scratch/newuser_attn_probe.py: fa1 turned NaN rows into 0 (its
    `ln > 0` test read a NaN sum as an empty row) once a later K tile came, the standard schedule's added -inf
    mask made masked inf scores NaN, and the Hopper kernel's zeroed q at scale 0 dropped NaN / inf."""
    attention = _attention()
    B, H, Sq, Sk, D = 1, 3, 150, 300, 64
    q, k, v = (rng.standard_normal((B, H, s, D)).astype(np.float32) for s in (Sq, Sk, Sk))
    q[0, 0, 7, :3] = np.nan         # head 0: row 7
    k[0, 1, 200, 5] = np.nan        # head 1: the rows that see key 200 (causal: i >= 50)
    k[0, 2, 250, :] = np.inf        # head 2: rows i >= 100 see key 250; +inf or -inf scores by q's signs
    qd, kd, vd = (_to_dev(cp, a, dtype) for a in (q, k, v))
    for scale in (None, 0.0):
        res = {}
        for sched in ("auto", "fa2", "fa1", "standard"):
            o, l = attention(qd, kd, vd, causal=True, softmax_scale=scale, schedule=sched, return_lse=True)
            res[sched] = (o.get().astype(np.float32), l.get())
        o0, l0 = res["fa2"]
        assert np.isnan(o0[0, 0, 7]).all() and np.isfinite(np.delete(o0[0, 0], 7, axis=0)).all()
        assert np.isfinite(o0[0, 1, :50]).all() and np.isfinite(o0[0, 2, :100]).all(), scale
        if scale is None:
            assert np.isnan(o0[0, 1, 50:]).all()
        for sched, (o, l) in res.items():
            where = np.argwhere(np.isnan(o) != np.isnan(o0))[:3]
            assert np.array_equal(np.isnan(o), np.isnan(o0)), (sched, scale, where)
            assert np.array_equal(np.isnan(l), np.isnan(l0)), (sched, scale)
            fin = np.isfinite(o0)
            assert np.allclose(o[fin], o0[fin], atol=3e-2), (sched, scale)
