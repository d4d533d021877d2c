"""LayerNorm / RMSNorm (cuflash.norm) against float64 references, forward and backward.

CPU part: the float64 backward derived here is checked against finite differences of the float64 forward
(reference.py), the handed cases' math on the reference, and the kernels' row geometry (head scalars, aligned
vectors, tail scalars, thread ownership) is replayed in NumPy to show every column is owned exactly once.
GPU part: every case in /work/shared/cases/norms.json, hidden sizes around every path switch (vector tails,
G steps, registers -> shared memory -> re-read), the three dtypes, with and without weight/bias/residual,
statistics, backward (dx, dweight, dbias) also against finite differences, extreme inputs, 64-bit offsets,
determinism, and bad input. Each comparison prints the kernel's error and that of a same-precision baseline
(float32 NumPy two-pass, rounded to the dtype) and asserts kernel <= 2 x baseline + a small floor.
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from cuflash import _compile, _dtypes, norm, reference
from conftest import poison

DTYPES = [np.dtype(np.float32), np.dtype(np.float16), _dtypes.bfloat16]
CASES = json.loads((Path(__file__).parent / "cases" / "norms.json").read_text())  # copy of shared/cases
E32 = float(np.finfo(np.float32).eps)


# ------------------------------------------------------------------------------------------------------------
# float64 references (reference.py's forwards and backwards)
def ref_forward(kind, h, weight=None, bias=None, eps=1e-5):
    """float64 (y, mean, rstd) over the last dim of a 2-D ``h`` (mean is None for RMSNorm)."""
    h = np.asarray(h, np.float64)
    if kind == "layer":
        y, mean, rstd, _ = reference.layer_norm(h, (h.shape[-1],), weight, bias, eps)
        return y, mean, rstd
    y, rstd, _ = reference.rms_norm(h, (h.shape[-1],), weight, eps)
    return y, None, rstd


def ref_backward(kind, dy, x, weight, mean, rstd):
    """float64 gradients of y = norm(x) * w (+ b) given the saved statistics: (dx, dw, db) (reference.py's)."""
    if kind == "layer":
        return reference.layer_norm_backward(dy, x, weight, mean, rstd)
    dx, dw = reference.rms_norm_backward(dy, x, weight, rstd)
    return dx, dw, np.asarray(dy, np.float64).sum(0)


def f32_forward(kind, h, weight=None, bias=None, eps=1e-5):
    """The straightforward same-precision baseline: float32 two-pass statistics (what torch computes)."""
    h = np.asarray(h, np.float32)
    if kind == "layer":
        mean = h.mean(-1, keepdims=True, dtype=np.float32)
        var = ((h - mean) ** 2).mean(-1, keepdims=True, dtype=np.float32)
        y = (h - mean) / np.sqrt(var + np.float32(eps))
    else:
        y = h / np.sqrt((h * h).mean(-1, keepdims=True, dtype=np.float32) + np.float32(eps))
    if weight is not None:
        y = y * np.asarray(weight, np.float32)
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return y


def f32_backward(kind, dy, x, weight, mean, rstd):
    dy, x = np.asarray(dy, np.float32), np.asarray(x, np.float32)
    r = np.asarray(rstd, np.float32)[:, None]
    mu = np.asarray(mean, np.float32)[:, None] if kind == "layer" else np.float32(0)
    xhat = (x - mu) * r
    g = dy * (np.asarray(weight, np.float32) if weight is not None else np.float32(1))
    c2 = (g * xhat).mean(-1, keepdims=True, dtype=np.float32)
    c1 = g.mean(-1, keepdims=True, dtype=np.float32) if kind == "layer" else np.float32(0)
    return r * (g - c1 - xhat * c2), (dy * xhat).sum(0, dtype=np.float32), dy.sum(0, dtype=np.float32)


def rnd(a, dt):
    """Round a float array to dtype ``dt`` (the value an input of that dtype holds)."""
    return np.asarray(a, np.float32).astype(dt)


def max_err(out, ref):
    o = np.asarray(out, np.float64)
    r = np.asarray(ref, np.float64)
    both = np.isfinite(o) & np.isfinite(r)
    d = np.abs(np.where(both, o - r, 0.0))
    return float(d.max(initial=0.0)), float(d.mean()) if d.size else 0.0


def y_scale(h, rstd, weight=None):
    """Per-row scale of a normalised output's rounding error: max(1, max|h| * rstd * max|w|) (shape (rows, 1)).

    y = (h - mean) * rstd * w: an error of one ulp of |h| in the mean (or in h - mean) moves y by
    ulp(|h|) * rstd * |w|, so a row whose spread is small against its values (large |h| * rstd) is
    ill-conditioned and every float32 implementation, the baseline included, errs there in proportion.
    """
    h = np.abs(np.asarray(h, np.float64))
    hm = np.where(np.isfinite(h), h, 0).max(axis=-1, keepdims=True, initial=0.0)
    r = np.asarray(rstd, np.float64).reshape(hm.shape)
    wm = 1.0 if weight is None else float(np.abs(np.asarray(weight, np.float64)).max(initial=1.0))
    return np.maximum(1.0, np.where(np.isfinite(r), hm * r * wm, 1.0))


def check_close(name, out, ref, base, dt, n, scale=None):
    """Kernel error <= 2 x baseline error + floor, elementwise (floor: tolerance(dt, n) at the output's scale:
    a number, or an array broadcast against the output, e.g. y_scale's per-row condition)."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (name, out.shape, ref.shape)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), fin), f"{name}: non-finite pattern differs from the reference"
    assert np.array_equal(np.isnan(out), np.isnan(ref)), f"{name}: NaN pattern differs from the reference"
    ke, km = max_err(out, ref)
    be, bm = max_err(base, ref)
    atol, rtol = _dtypes.tolerance(dt, n)
    s = max(1.0, float(np.abs(np.where(fin, ref, 0)).max(initial=0.0)))
    if scale is not None:
        s = np.maximum(s, np.asarray(scale, np.float64)) if np.ndim(scale) else float(scale)
    floor = rtol * np.broadcast_to(s, out.shape)
    err = np.abs(np.where(fin, out - ref, 0.0))
    worst = np.unravel_index(int(np.argmax(err - floor)), out.shape) if out.size else ()
    print(f"  {name:<10} kernel max {ke:.3e} mean {km:.3e} | baseline max {be:.3e} mean {bm:.3e} | floor "
          f"{float(floor.min(initial=np.inf)):.2e}..{float(floor.max(initial=0.0)):.2e}")
    assert (err <= 2 * be + floor).all(), (f"{name}: error {err[worst]:.3e} at {worst} > 2 x baseline {be:.3e} "
                                           f"+ floor {floor[worst]:.2e}")


# ------------------------------------------------------------------------------------------------------------
# CPU tests
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("with_weight", [False, True])
def test_backward_reference_matches_finite_differences(kind, with_weight, rng):
    rows, hidden = 3, 7
    x = rng.standard_normal((rows, hidden)) * 2 + 1
    w = rng.standard_normal(hidden) if with_weight else None
    b = rng.standard_normal(hidden) if (with_weight and kind == "layer") else None
    dy = rng.standard_normal((rows, hidden))
    eps = 1e-5

    def loss(xx, ww=w, bb=b):
        return float((ref_forward(kind, xx, ww, bb, eps)[0] * dy).sum())

    _, mean, rstd = ref_forward(kind, x, w, b, eps)
    dx, dw, db = ref_backward(kind, dy, x, w, mean, rstd)
    step = 1e-6
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = step
        fd[i] = (loss(x + e) - loss(x - e)) / (2 * step)
    np.testing.assert_allclose(dx, fd, rtol=1e-6, atol=1e-7)
    if with_weight:
        fdw = np.array([(loss(x, w + step * np.eye(hidden)[j]) - loss(x, w - step * np.eye(hidden)[j])) / (2 * step)
                        for j in range(hidden)])
        np.testing.assert_allclose(dw, fdw, rtol=1e-6, atol=1e-7)
        if b is not None:
            fdb = np.array([(loss(x, w, b + step * np.eye(hidden)[j]) - loss(x, w, b - step * np.eye(hidden)[j]))
                            / (2 * step) for j in range(hidden)])
            np.testing.assert_allclose(db, fdb, rtol=1e-6, atol=1e-7)


def _replay_row(itemsize, hidden, off, G):
    """NumPy replay of norm.cu's row_split and thread ownership; returns the owner count of every column."""
    vec = 16 // itemsize
    head = min((vec - off % vec) % vec, hidden)
    body = (hidden - head) // vec
    tail = hidden - head - body * vec
    count = np.zeros(hidden, np.int64)
    _, nchunks, _ = norm._geometry(itemsize, hidden)
    assert head < G and tail < G
    for t in range(G):
        for k in range(nchunks):
            v = k * G + t
            if v < body:
                count[head + v * vec: head + v * vec + vec] += 1
        if t < head:
            count[t] += 1
        if t < tail:
            count[head + body * vec + t] += 1
    return count, head, body, tail


@pytest.mark.parametrize("itemsize", [4, 2])
@pytest.mark.parametrize("hidden", [1, 2, 3, 5, 7, 8, 9, 31, 33, 127, 128, 129, 767, 768, 769, 1023, 1025, 1535,
                                    1536, 4095, 4097, 8191, 8193, 16383, 16385, 32769, 65537])
def test_row_geometry_owns_every_column_once(itemsize, hidden):
    G, nchunks, _ = norm._geometry(itemsize, hidden, 200 * 1024)
    assert 32 <= G <= norm.MAX_THREADS and G % 32 == 0
    vec = 16 // itemsize
    for row in (0, 1, 2, 3, 5, 7, 70001):
        count, head, body, tail = _replay_row(itemsize, hidden, row * hidden, G)
        assert (count == 1).all(), (row, head, body, tail, np.flatnonzero(count != 1)[:10])
        if body:
            assert (row * hidden + head) % vec == 0  # the body starts 16-byte aligned


def test_handed_cases_on_the_reference():
    """The math of the handed cases holds on the float64 reference (the kernels must match it on the GPU)."""
    for c in CASES:
        if c["id"] == "ln-large-mean":
            x = np.array(c["input"]["x"], np.float32)
            y = reference.layer_norm(x, c["kwargs"]["normalized_shape"], eps=c["kwargs"]["eps"])[0]
            np.testing.assert_allclose(y, c["expect"], atol=c["tolerance"]["atol"])
            naive_var = (x.astype(np.float32) ** 2).mean() - x.astype(np.float32).mean() ** 2
            print("E[x^2]-E[x]^2 in float32 gives var", naive_var, "instead of 1.25")


def test_numpy_input_is_rejected_before_launch():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(TypeError, match="CuPy"):
        norm.layer_norm(x, (8,))
    with pytest.raises(TypeError, match="CuPy"):
        norm.rms_norm(x, 8, eps=1e-6)


def test_rms_norm_default_eps_is_float32s(monkeypatch):
    """eps=None is finfo(float32).eps for every dtype, as torch.nn.functional.rms_norm since torch 2.6 (its float32
    "opmath" statistics), not finfo(x.dtype).eps (bfloat16 7.8e-3): checked here on the value passed to the
    kernels, on the H200 against torch (test_rms_norm_default_eps_as_torch)."""
    seen = []
    monkeypatch.setattr(norm, "_forward", lambda kind, fn, x, shape, w, b, eps, *rest: seen.append(eps))
    norm.rms_norm(object(), 8)
    norm.rms_norm(object(), 8, eps=1e-6)
    assert seen == [float(np.finfo(np.float32).eps), 1e-6]


def test_every_kernel_is_declared():
    from cuflash import _compile

    names = {n for s, n, _, _ in _compile.declared() if s == "norm.cu"}
    for dt in DTYPES:
        for wdt in norm._wtypes(dt):
            for kind in (norm.LAYER, norm.RMS):
                for res in (False, True):
                    for warp in (False, True):
                        assert norm._fwd_name(dt, wdt, kind, res, warp) in names
                        assert norm._stream_name(dt, wdt, kind, res, warp) in names
                    assert norm._fwd_name(dt, wdt, kind, res, False, True) in names  # block path, two-pass
                    for warp in (False, True):  # rows of whole vectors
                        assert norm._fwd_name(dt, wdt, kind, res, warp, True, True) in names
                    for c in (2, 4, 8):
                        assert norm._fwd_cluster_name(dt, wdt, kind, res, c) in names
                        if not res:  # the study setting FWD_CLUSTER_HOLD (rows without residual)
                            assert norm._fwd_cluster_name(dt, wdt, kind, res, c, True) in names
                            for n in norm.PREFETCH_BLOCKS[kind]:
                                assert norm._fwd_cluster_name(dt, wdt, kind, res, c, True, n) in names
                assert norm._bwd_name(dt, wdt, kind) in names
                assert norm._bwd_stream_name(dt, wdt, kind, 2) in names
                assert norm._bwd_stream_name(dt, wdt, kind, 4) in names
        assert norm._red_name(dt) in names


@pytest.mark.parametrize("cc", [80, 90])
@pytest.mark.parametrize("itemsize", [4, 2])
def test_backward_stream_geometry(itemsize, cc):
    """norm_bwd_stream takes exactly the rows of whole 16-byte vectors with 64..2048 of them, two vectors per
    thread up to 1024 vectors and four beyond, with just enough threads (G, a multiple of 32, at most 512),
    max(1, 128 // G) rows a block (blocks of 96..512 threads: 96 for rows of 129..192 vectors); on compute
    capability 9.0 longer rows of up to 8 x 2048 vectors go to norm_bwd_cluster, over the smallest cluster of 2, 4
    or 8 blocks that leaves each block at most 2048 vectors (four a thread, G >= 64); every other row length goes
    to norm_bwd."""
    vec = 16 // itemsize
    lo, hi = norm.BWD_STREAM_VECS
    for hidden in sorted({1, 7, 8, 63 * vec, lo * vec - 1, lo * vec, lo * vec + 1, lo * vec + vec, 1000, 1024,
                          1536, 2048, 3000, 4096, 8192, 1024 * vec, 1025 * vec, 16384, hi * vec - vec, hi * vec,
                          hi * vec + vec, 2 * hi * vec, 2 * hi * vec + vec, 4 * hi * vec, 8 * hi * vec,
                          8 * hi * vec + vec, 65536, 131072}):
        geo = norm._bwd_stream_geometry(itemsize, hidden, cc)
        body = hidden // vec
        if hidden % vec or body < lo or body > (8 * hi if cc >= 90 else hi):
            assert geo is None, hidden
            continue
        G, rpb, vpt, c = geo
        if body > hi:
            c_want = next(c for c in (2, 4, 8) if body <= c * hi)
            assert (c, vpt, rpb) == (c_want, 4, 1), hidden
            assert G % 32 == 0 and 64 <= G <= 512 and 4 * G * c >= body > 4 * (G - 32) * c, hidden
            continue
        assert c == 1 and vpt == (2 if body <= 1024 else 4), hidden
        assert G % 32 == 0 and vpt * G >= body > vpt * (G - 32), hidden
        assert G <= 512 and rpb == max(1, 128 // G) and 96 <= G * rpb <= 512, hidden


def test_two_pass_only_for_rows_held_on_chip(monkeypatch):
    """The register forward's TWO_PASS flag (LayerNorm statistics as two plain sums) covers the NV register chunks
    and (SMEMC) the shared-memory chunks, nothing re-read from HBM, so a launch must never pair it with
    nchunks > NV + smem_chunks, and every LayerNorm row that fits on chip takes it; RMSNorm never does; SMEMC (the
    cp.async-filled shared-memory chunks) exactly when the row has such chunks; every kernel a launch asks for is
    declared. Plans only (no device): get_kernel and the device queries are stubbed."""
    import re

    from cuflash import _compile

    declared = {n for s, n, _, _ in _compile.declared() if s == "norm.cu"}
    asked = []
    monkeypatch.setattr(_compile, "get_kernel", lambda src, name, extra=(): asked.append(name) or name)
    monkeypatch.setattr(_compile, "max_shared_optin", lambda dev: 227 * 1024)
    monkeypatch.setattr(_compile, "sm_count", lambda dev: 132)
    monkeypatch.setattr(_compile, "compute_capability", lambda dev: 80)  # no cluster forward: norm_fwd's rows
    monkeypatch.setattr(norm, "_resident_blocks", lambda *a: 1)
    monkeypatch.setattr(norm, "_FWD_CFG", {})
    pattern = re.compile(r"norm_fwd<[^,]+, [^,]+, \d, (\d+), \d+, \d+, \w+, \w+, (\w+), (\w+), (\w+)>")
    hiddens = list(range(1, 1100, 7)) + [2047, 2048, 4096, 8191, 8192, 16384, 16392, 32768, 65537, 1 << 20]
    two_pass = 0
    for dt in DTYPES:
        for wdt in norm._wtypes(dt):
            for kind in (norm.LAYER, norm.RMS):
                for res in (False, True):
                    for hidden in hiddens:
                        plan = norm._fwd_config(kind, np.dtype(dt), np.dtype(wdt), hidden, res, 0)
                        if plan.stream:
                            continue
                        name = asked[-1]
                        assert name in declared, name
                        nv, tp, aligned, smemc = pattern.search(name).groups()
                        assert aligned == "false" or (tp == "true" and hidden % (16 // np.dtype(dt).itemsize) == 0)
                        assert (smemc == "true") == (plan.smem_chunks > 0), (name, hidden, plan.smem_chunks)
                        on_chip = plan.nchunks <= int(nv) + plan.smem_chunks
                        assert (tp == "true") == (kind == norm.LAYER and on_chip), (name, hidden, plan)
                        if tp == "true":
                            two_pass += 1
    assert two_pass > 0


@pytest.mark.parametrize("itemsize", [4, 2])
def test_forward_cluster_plans(monkeypatch, itemsize):
    """The cluster forward (norm_fwd_cluster) takes exactly the whole-vector rows of FWD_CLUSTER_MIN_VECS or more
    vectors that some cluster size covers at four vectors a thread, on compute capability 9.0 only; the size is the
    smallest that does, G a multiple of 32 within FWD_CLUSTER_MAX_THREADS and just enough; the kernel asked for is
    declared. Plans only (no device)."""
    from cuflash import _compile

    declared = {n for s, n, _, _ in _compile.declared() if s == "norm.cu"}
    asked = []
    monkeypatch.setattr(_compile, "get_kernel", lambda src, name, extra=(): asked.append((name, extra)) or name)
    monkeypatch.setattr(_compile, "max_shared_optin", lambda dev: 227 * 1024)
    monkeypatch.setattr(_compile, "sm_count", lambda dev: 132)
    monkeypatch.setattr(norm, "_resident_blocks", lambda *a: 1)
    monkeypatch.setattr(_compile, "max_active_clusters", lambda kern, c, block, smem: 120 // c)
    dt = np.dtype(np.float32) if itemsize == 4 else _dtypes.bfloat16
    vec, cap, lo = 16 // itemsize, 4 * norm.FWD_CLUSTER_MAX_THREADS, norm.FWD_CLUSTER_MIN_VECS
    bodies = (1, lo - 1, lo, lo + 1, 2 * cap, 2 * cap + 1, 4 * cap, 4 * cap + 1, 8 * cap - 1, 8 * cap, 8 * cap + 1)
    hit = 0
    for cc in (80, 90):
        monkeypatch.setattr(_compile, "compute_capability", lambda dev: cc)
        for body in bodies:
            for hidden in (body * vec, body * vec + 1):
                for kind in (norm.LAYER, norm.RMS):
                    for res in (False, True):
                        monkeypatch.setattr(norm, "_FWD_CFG", {})
                        plan = norm._fwd_config(kind, dt, dt, hidden, res, 0)
                        held = (kind == norm.LAYER and not res and itemsize == 4
                                and hidden * itemsize >= norm.FWD_CLUSTER_PLAIN_LAYER_BYTES)
                        geo = norm._fwd_cluster_geometry(itemsize, hidden, cc)  # weights of x's dtype:
                        staged = geo is not None and geo[0] <= norm.FWD_CLUSTER_LAYER_AFFINE
                        whole = (kind == norm.RMS and not res and itemsize == 4  # in norm_fwd's registers
                                 and body <= norm.NV * norm.FWD_MAX_THREADS and not norm.FWD_CLUSTER_RMS32_WHOLE)
                        expect = (cc >= 90 and hidden % vec == 0 and lo <= body <= 8 * cap and not whole
                                  and (kind == norm.RMS or res or norm.FWD_CLUSTER_PLAIN_LAYER or held or staged))
                        assert bool(plan.cluster) == expect, (cc, hidden, plan)
                        if not expect:
                            continue
                        hit += 1
                        c, G = plan.cluster, plan.G
                        name, extra = asked[-1]
                        assert name == norm._fwd_cluster_name(dt, dt, kind, res, c, held) and name in declared
                        assert bool(plan.cap) == held  # held: persistent, a grid cap of whole clusters
                        # each thread's four weight (and LayerNorm's bias) vectors in shared memory: held, or
                        # copied there per row (16-byte weight vectors, as here); none for float32 weights of a
                        # 16-bit row (read per use) or without weight and bias
                        assert plan.smem == 4 * G * 16 * (2 if kind == norm.LAYER else 1), plan
                        monkeypatch.setattr(norm, "_FWD_CFG", {})
                        assert norm._fwd_config(kind, dt, dt, hidden, res, 0, affine=False).smem == (
                            plan.smem if held else 0)
                        if itemsize == 2:
                            monkeypatch.setattr(norm, "_FWD_CFG", {})
                            f32w = norm._fwd_config(kind, dt, np.dtype(np.float32), hidden, res, 0)
                            assert f32w.smem == 0, f32w  # (held rows are float32 ones)
                        assert extra == norm._SM90_OPTIONS
                        assert G % 32 == 0 and G <= norm.FWD_CLUSTER_MAX_THREADS and c * 4 * G >= body
                        assert c * 4 * (G - 32) < body  # G just enough
                        assert c == 2 or math.ceil(body / (c // 2)) > cap  # the smallest size that covers
    assert hit > 0


def _plans_on_sm90(monkeypatch):
    """Plans without a device, as on an H200 (compute capability 9.0, 132 SMs, 227 KiB of shared memory): returns
    the declared norm.cu kernel names and the list of names the planner asks for."""
    from cuflash import _compile

    declared = {n for s, n, _, _ in _compile.declared() if s == "norm.cu"}
    asked = []
    monkeypatch.setattr(_compile, "get_kernel", lambda src, name, extra=(): asked.append(name) or name)
    monkeypatch.setattr(_compile, "max_shared_optin", lambda dev: 227 * 1024)
    monkeypatch.setattr(_compile, "sm_count", lambda dev: 132)
    monkeypatch.setattr(_compile, "compute_capability", lambda dev: 90)
    monkeypatch.setattr(_compile, "max_active_clusters", lambda kern, c, block, smem: 120 // c)
    monkeypatch.setattr(norm, "_resident_blocks", lambda *a: 1)
    return declared, asked


@pytest.mark.parametrize("itemsize", [4, 2])
def test_forward_cluster_plans_without_affine(monkeypatch, itemsize):
    """LayerNorm without residual takes the cluster path where its rows need at most FWD_CLUSTER_LAYER_NO_AFFINE
    blocks without weight and bias, FWD_CLUSTER_LAYER_AFFINE with them in x's dtype (staged in shared memory; 0:
    never), never with float32 weights of a 16-bit row (unless held). Plans only."""
    declared, asked = _plans_on_sm90(monkeypatch)
    dt = np.dtype(np.float32) if itemsize == 4 else _dtypes.bfloat16
    vec, lo = 16 // itemsize, norm.FWD_CLUSTER_MIN_VECS
    for limit, alimit in ((norm.FWD_CLUSTER_LAYER_NO_AFFINE, norm.FWD_CLUSTER_LAYER_AFFINE), (0, 0), (4, 4)):
        monkeypatch.setattr(norm, "FWD_CLUSTER_LAYER_NO_AFFINE", limit)
        monkeypatch.setattr(norm, "FWD_CLUSTER_LAYER_AFFINE", alimit)
        for body in (lo - 1, lo, 2 * lo, 2 * lo + 1, 4 * lo):
            hidden = body * vec
            geo = norm._fwd_cluster_geometry(itemsize, hidden, 90)
            for affine, wdt in ((False, dt), (True, dt), (True, np.dtype(np.float32))):
                monkeypatch.setattr(norm, "_FWD_CFG", {})
                plan = norm._fwd_config(norm.LAYER, dt, wdt, hidden, False, 0, affine=affine)
                held = norm._plain_layer_held(norm.LAYER, dt, hidden, False)
                expect = geo is not None and (held or (geo[0] <= (alimit if affine else limit)
                                                       and wdt.itemsize == dt.itemsize))
                assert bool(plan.cluster) == expect, (limit, alimit, body, affine, wdt, plan)
                if expect:
                    assert asked[-1] == norm._fwd_cluster_name(dt, wdt, norm.LAYER, False, plan.cluster, held)
                    assert asked[-1] in declared
                    # staged: each thread's four weight and bias vectors in shared memory
                    assert plan.smem == (4 * plan.G * 16 * 2 if affine or held else 0)
    monkeypatch.setattr(norm, "FWD_CLUSTER_LAYER_NO_AFFINE", 4)
    monkeypatch.setattr(norm, "FWD_CLUSTER_LAYER_AFFINE", 2)
    monkeypatch.setattr(norm, "_FWD_CFG", {})
    assert norm._fwd_config(norm.LAYER, dt, dt, 2 * lo * vec, False, 0, affine=False).cluster == 4
    # the plan cache keeps the two apart (no clearing between them)
    assert not norm._fwd_config(norm.LAYER, dt, dt, 2 * lo * vec, False, 0, affine=True).cluster
    assert norm._fwd_config(norm.LAYER, dt, dt, 2 * lo * vec, False, 0, affine=False).cluster == 4
    assert norm._fwd_config(norm.LAYER, dt, dt, lo * vec, False, 0, affine=True).cluster == 2


def _warp_kernel(name):
    """Whether a norm_fwd instantiation name is the warp-per-row kernel (its WARP template argument)."""
    return name[name.index("<") + 1:-1].split(", ")[7] == "true"


def test_forward_short_row_plans(monkeypatch):
    """The register kernel's path on short rows, as measured on the H200 (norm_short_ab runs 3-5): a warp per row
    up to 3 KiB (float32 768, 16-bit 1K), float32 1K on 64-thread blocks; 16-bit RMSNorm without residual on the
    block path unless WARP_RMS16; float32 RMSNorm 8K without residual in norm_fwd's registers (512 threads of four
    vectors) unless FWD_CLUSTER_RMS32_WHOLE, with residual and at bfloat16 16K on the cluster path. Plans only."""
    declared, asked = _plans_on_sm90(monkeypatch)
    f32, bf16, f16 = np.dtype(np.float32), np.dtype(_dtypes.bfloat16), np.dtype(np.float16)

    def plan(kind, dt, hidden, res=False):
        norm._FWD_CFG.clear()
        p = norm._fwd_config(kind, dt, dt, hidden, res, 0)
        assert asked[-1] in declared
        return p, asked[-1]

    L, R = norm.LAYER, norm.RMS
    for kind, dt, hidden, res, warp, G in [
            (L, f32, 768, False, True, 32), (R, f32, 768, False, True, 32), (L, f32, 1024, False, False, 64),
            (R, f32, 1024, False, False, 64), (L, f32, 1024, True, False, 64), (L, bf16, 1024, False, True, 32),
            (L, f16, 1024, False, True, 32), (R, bf16, 1024, True, True, 32), (R, bf16, 1024, False, False, 32),
            (R, f16, 512, False, False, 32), (R, bf16, 1025, False, False, 32), (R, f32, 512, False, True, 32)]:
        p, name = plan(kind, dt, hidden, res)
        assert (_warp_kernel(name), p.G, p.cluster, p.stream) == (warp, G, 0, False), (kind, dt, hidden, res)
    monkeypatch.setattr(norm, "WARP_RMS16", True)  # (the plan cache is keyed by the setting)
    assert _warp_kernel(plan(R, bf16, 1024)[1]) and _warp_kernel(plan(R, f16, 512)[1])
    monkeypatch.setattr(norm, "WARP_RMS16", False)
    p, name = plan(R, f32, 8192)
    assert (p.cluster, p.G, p.nchunks, _warp_kernel(name)) == (0, 512, 4, False)
    assert plan(R, f32, 8192, res=True)[0].cluster == 2 and plan(R, bf16, 16384)[0].cluster == 2
    assert plan(R, f32, 8196)[0].cluster == 4  # 2049 vectors: beyond the registers
    monkeypatch.setattr(norm, "FWD_CLUSTER_RMS32_WHOLE", True)
    assert plan(R, f32, 8192)[0].cluster == 2


def test_forward_cluster_hold_plans(monkeypatch):
    """FWD_CLUSTER_HOLD (study setting): rows without residual take the persistent cluster kernel, with shared
    memory for each thread's weight (and LayerNorm's bias) vectors and a grid cap of whole clusters; rows with a
    residual keep the one-row-per-cluster kernel. Plans only (no device)."""
    from cuflash import _compile

    declared = {n for s, n, _, _ in _compile.declared() if s == "norm.cu"}
    asked = []
    monkeypatch.setattr(_compile, "get_kernel", lambda src, name, extra=(): asked.append(name) or name)
    monkeypatch.setattr(_compile, "max_active_clusters", lambda kern, c, block, smem: 120 // c)
    monkeypatch.setattr(_compile, "compute_capability", lambda dev: 90)
    monkeypatch.setattr(_compile, "sm_count", lambda dev: 132)
    monkeypatch.setattr(_compile, "max_shared_optin", lambda dev: 227 * 1024)
    monkeypatch.setattr(norm, "FWD_CLUSTER_HOLD", True)
    monkeypatch.setattr(norm, "FWD_CLUSTER_PLAIN_LAYER", True)
    for dt in DTYPES:
        for wdt in norm._wtypes(dt):
            for kind in (norm.LAYER, norm.RMS):
                for res in (False, True):
                    monkeypatch.setattr(norm, "_FWD_CFG", {})
                    hidden = 8192 * (16 // np.dtype(dt).itemsize)
                    plan = norm._fwd_config(kind, np.dtype(dt), np.dtype(wdt), hidden, res, 0)
                    assert plan.cluster == 8 and asked[-1] in declared
                    assert asked[-1].endswith(", true>") == (not res)
                    for n in norm.PREFETCH_BLOCKS[norm.LAYER] if not res else ():  # FWD_CLUSTER_PREFETCH
                        monkeypatch.setattr(norm, "FWD_CLUSTER_PREFETCH", n)  # (RMSNorm's bounds stay 4)
                        pf = norm._fwd_config(kind, np.dtype(dt), np.dtype(wdt), hidden, res, 0)
                        monkeypatch.setattr(norm, "FWD_CLUSTER_PREFETCH", 0)
                        assert asked[-1].endswith(f", true, {n if kind == norm.LAYER else 4}>")
                        assert asked[-1] in declared
                        assert (pf.cluster, pf.G, pf.smem) == (plan.cluster, plan.G, plan.smem)
                    per = 4 * plan.G * 16 * np.dtype(wdt).itemsize // np.dtype(dt).itemsize
                    if res:  # not held: the weights copied in per row where they are 16-byte vectors
                        same = np.dtype(wdt) == np.dtype(dt)
                        assert plan.cap == 0 and plan.smem == (per * (2 if kind == norm.LAYER else 1) if same else 0)
                    else:
                        assert plan.cap == 8 * (120 // 8)
                        assert plan.smem == per * (2 if kind == norm.LAYER else 1)



def test_backward_plans_ask_for_declared_kernels(monkeypatch):
    """Every backward plan names a declared kernel; a streamed plan's VPT is the geometry's and its shared memory
    ([stage][x | dy][VPT][thread] of 16 bytes) fits the device, and a device with too little shared memory for
    it gets norm_bwd; rows longer than one block takes go over a cluster on compute capability 9.0 only, with as
    many clusters as the driver says fit. Plans only (no device): get_kernel and the device queries are stubbed."""
    from cuflash import _compile

    declared = {n for s, n, _, _ in _compile.declared() if s == "norm.cu"}
    monkeypatch.setattr(_compile, "get_kernel", lambda src, name, extra=(): name)
    monkeypatch.setattr(_compile, "sm_count", lambda dev: 132)
    monkeypatch.setattr(_compile, "max_active_clusters", lambda kern, c, block, smem: 120 // c)
    monkeypatch.setattr(norm, "_resident_blocks", lambda *a: 1)
    for optin, cc, dev in ((227 * 1024, 90, 0), (99 * 1024, 86, 1)):  # H100/H200-class, a 99 KiB sm_86 device
        monkeypatch.setattr(_compile, "max_shared_optin", lambda d, o=optin: o)
        monkeypatch.setattr(_compile, "compute_capability", lambda d, c=cc: c)
        monkeypatch.setattr(norm, "_BWD_CFG", {})
        for dt in DTYPES:
            dt = np.dtype(dt)
            for wdt in norm._wtypes(dt):
                for kind in (norm.LAYER, norm.RMS):
                    for hidden in (1, 1001, 512, 4096, 8192, 8196, 16384, 16392, 32768, 65536, 131072):
                        pl = norm._bwd_config(kind, dt, np.dtype(wdt), hidden, True, dev)
                        assert pl.kern in declared, pl.kern
                        geo = norm._bwd_stream_geometry(dt.itemsize, hidden, cc)
                        if pl.stream:
                            G, rpb, vpt, c = geo
                            assert (pl.G, pl.rpb, pl.vpt, pl.cluster) == (G, rpb, vpt, c)
                            if c == 1:
                                assert f", {vpt}, 512, 1>" in pl.kern
                            else:
                                assert "norm_bwd_cluster" in pl.kern and pl.kern.endswith(f", {c}, true>")
                                assert pl.max_blocks == c * (120 // c)
                            assert pl.smem == norm.BWD_STREAM_STAGES * 2 * vpt * G * rpb * 16 <= optin - 1024
                        else:
                            assert geo is None or norm.BWD_STREAM_STAGES * 2 * geo[2] * geo[0] * geo[1] * 16 > optin - 1024
    # the driver cannot say how many clusters fit: half the SMs' worth of clusters (a guess that always fits)
    monkeypatch.setattr(_compile, "max_active_clusters", lambda kern, c, block, smem: None)
    monkeypatch.setattr(_compile, "max_shared_optin", lambda d: 227 * 1024)
    monkeypatch.setattr(_compile, "compute_capability", lambda d: 90)
    monkeypatch.setattr(norm, "_BWD_CFG", {})
    pl = norm._bwd_config(norm.LAYER, np.dtype(np.float32), np.dtype(np.float32), 32768, True, 0)
    assert pl.cluster == 4 and pl.max_blocks == 4 * (132 // 8)

# ------------------------------------------------------------------------------------------------------------
# GPU helpers
def _dev(cp, a):
    return cp.asarray(a)


def _call(cp, kind, x, w, b, r, eps, stats):
    shape = (x.shape[-1],)
    if kind == "layer":
        return norm.layer_norm(x, shape, w, b, eps, residual=r, return_stats=stats)
    return norm.rms_norm(x, shape, w, eps, residual=r, return_stats=stats)


def _run_forward(cp, rng, kind, dt, rows, hidden, variant, check_rows=None, loc=5.0, scale=3.0):
    """One forward call and its checks. variant: 0 plain, 1 weight+bias float32 + residual + stats,
    2 weight (+bias) in the input dtype + stats, 3 residual only, 4 weight+bias float32 + stats, 5 weight (+bias)
    in the input dtype + residual + stats (the cluster forward's weights staged in shared memory)."""
    eps = 1e-5 if kind == "layer" else 1e-6
    x = rnd(rng.standard_normal((rows, hidden)) * scale + loc, dt)
    r = rnd(rng.standard_normal((rows, hidden)), dt) if variant in (1, 3, 5) else None
    wdt = np.float32 if variant in (1, 4) else dt
    w = rnd(rng.standard_normal(hidden) * 0.5 + 1, wdt) if variant in (1, 2, 4, 5) else None
    b = rnd(rng.standard_normal(hidden), wdt) if (variant in (1, 2, 4, 5) and kind == "layer") else None
    stats = variant in (1, 2, 4, 5)
    out = _call(cp, kind, _dev(cp, x), None if w is None else _dev(cp, w), None if b is None else _dev(cp, b),
                None if r is None else _dev(cp, r), eps, stats)
    out = out if isinstance(out, tuple) else (out,)
    y = out[0]
    k = 1
    h = x
    if r is not None:
        h = (x.astype(np.float32) + r.astype(np.float32)).astype(dt)  # the rounded new residual stream
        hk = out[1].get()
        assert hk.dtype == dt and np.array_equal(hk.view(np.uint8), h.view(np.uint8)), "h != round(x + residual)"
        k = 2
    sel = check_rows if check_rows is not None else slice(None)
    yk = y.get()[sel]
    assert yk.dtype == dt and y.shape == x.shape
    hs = h[sel]
    ref, mean, rstd = ref_forward(kind, hs.astype(np.float64), w, b, eps)
    base = rnd(f32_forward(kind, hs, w, b, eps), dt)
    print(f"{kind} {dt} rows={rows} hidden={hidden} variant={variant}")
    check_close("y", yk, ref, base, dt, hidden, scale=y_scale(hs, rstd, w))
    if stats:
        h32 = hs.astype(np.float32)
        floor = 2e-5 + math.sqrt(hidden) * E32
        if kind == "layer":
            mk, rk = out[k].get()[sel], out[k + 1].get()[sel]
            assert out[k].dtype == np.float32 and out[k].shape == (rows,)
            m32 = h32.mean(-1, dtype=np.float32)
            std = 1 / rstd
            ke = float((np.abs(mk - mean) / (np.abs(mean) + std)).max())
            be = float((np.abs(m32 - mean) / (np.abs(mean) + std)).max())
            print(f"  mean rel err kernel {ke:.2e} baseline {be:.2e}")
            assert ke <= 2 * be + floor
            r32 = 1 / np.sqrt(((h32 - m32[:, None]) ** 2).mean(-1, dtype=np.float32) + np.float32(eps))
        else:
            rk = out[k].get()[sel]
            r32 = 1 / np.sqrt((h32 * h32).mean(-1, dtype=np.float32) + np.float32(eps))
        assert out[-1].dtype == np.float32
        ke = float((np.abs(rk - rstd) / rstd).max())
        be = float((np.abs(r32 - rstd) / rstd).max())
        print(f"  rstd rel err kernel {ke:.2e} baseline {be:.2e}")
        assert ke <= 2 * be + floor
    return out


FWD_HIDDEN = [1, 3, 7, 8, 9, 31, 127, 128, 129, 255, 257, 767, 768, 769, 1023, 1024, 1025, 1535, 1536, 2049, 4097,
              8191, 8192, 8193, 16384, 16385, 32768, 32777, 65537, 140001]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", FWD_HIDDEN)
def test_forward_matches_reference(cp, rng, kind, dt, hidden):
    rows = 7 if hidden <= 70000 else 3
    for variant in (0, 1, 2, 3):
        _run_forward(cp, rng, kind, dt, rows, hidden, variant)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("path", ["registers", "registers-strided", "stream", "stream-3stages", "stream-fixed"])
def test_forward_paths_rows_and_grid_stride(cp, rng, monkeypatch, kind, dt, path):
    """Both forward kernels at row counts that leave the last block partly empty and make blocks stride over
    rows: the register kernel (warp per row up to 3 KiB, WARP_ROWS rows a block; block per row above;
    ``registers-strided`` caps its grid at one wave) and the streamed kernel (whole-vector rows, persistent
    grid: warp per row up to 4 KiB, block per row above, with two rows staged, or three: ``stream-3stages``;
    rows claimed from the ticket, or ``stream-fixed``: a fixed share a block)."""
    monkeypatch.setattr(norm, "STREAM", path.startswith("stream"))
    monkeypatch.setattr(norm, "STREAM_TICKET", path != "stream-fixed")
    monkeypatch.setattr(norm, "STREAM_STAGES", 3 if path == "stream-3stages" else 2)
    monkeypatch.setattr(norm, "STREAM_MIN_VECS", 0)  # every whole-vector row length streams
    monkeypatch.setattr(norm, "FWD_WAVES", 1 if path == "registers-strided" else 0)
    hiddens = (8, 129, 511, 767, 1023, 1024, 1025, 2048, 4096, 12288)  # float32 767: 6 vectors a lane (warp path)
    # 12288, 12289 float32 in a capped grid: rows with shared-memory chunks (cp.async-filled) in turn per block
    for hidden in hiddens if path != "registers-strided" else (767, 1023, 1025, 12288, 12289):
        for rows in (9, 1001, 12001):
            if rows * hidden > 13_000_000:
                continue
            for variant in (0, 1, 3):
                _run_forward(cp, rng, kind, dt, rows, hidden, variant, check_rows=None if rows < 2000 else np.s_[::7])


@pytest.mark.gpu
@pytest.mark.parametrize("dt", [d for d in DTYPES if np.dtype(d).itemsize == 2], ids=str)
def test_forward_rms16_warp_path(cp, rng, monkeypatch, dt):
    """16-bit RMSNorm rows without residual on the warp-per-row path (WARP_RMS16; by default they take the block
    path): no weight, weight in x's dtype, float32 weight (with stats), rows leaving the last block part empty."""
    monkeypatch.setattr(norm, "WARP_RMS16", True)
    for hidden in (8, 129, 511, 1023, 1024):
        for rows in (9, 1001):
            for variant in (0, 2, 4):
                _run_forward(cp, rng, "rms", dt, rows, hidden, variant)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [1024, 4096], ids=["warp-per-row", "block-per-row"])
def test_stream_ticket_per_stream_and_reset(cp, rng, monkeypatch, hidden):
    """The streamed forward's row ticket: launches on two streams, not synchronised between them, each with a
    fresh input (a row skipped would keep another call's values or garbage), every row checked; every ticket is
    back to zero afterwards (the last block out resets it), so the next launch starts at row 0."""
    monkeypatch.setattr(norm, "STREAM_MIN_VECS", 0)
    monkeypatch.setattr(norm, "STREAM_TICKET", True)
    rows, dt = 3001, np.dtype(np.float32)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    xs, ws, bs, outs = [], [], [], []
    for i in range(6):
        x = rnd(rng.standard_normal((rows, hidden)) * 2 + 1, dt)
        w, b = rnd(rng.standard_normal(hidden) * 0.5 + 1, dt), rnd(rng.standard_normal(hidden), dt)
        with streams[i % 2]:
            dx, dw, db = cp.asarray(x), cp.asarray(w), cp.asarray(b)
            outs.append(norm.layer_norm(dx, (hidden,), dw, db))
        xs.append(x), ws.append(w), bs.append(b)
    for st in streams:
        st.synchronize()
    pl = norm._fwd_config(norm.LAYER, dt, dt, hidden, False, cp.cuda.Device().id)
    assert pl.stream, "this row length is expected on norm_fwd_stream"
    for x, w, b, y in zip(xs, ws, bs, outs):
        ref, _, rstd = ref_forward("layer", x.astype(np.float64), w, b, 1e-5)
        check_close("y", y.get(), ref, rnd(f32_forward("layer", x, w, b, 1e-5), dt), dt, hidden,
                    scale=y_scale(x, rstd, w))
    tickets = [t for (d, s_), t in _compile._COUNTERS.items() if s_ in (st.ptr for st in streams)]
    assert len(tickets) == 2 and all(int(v) == 0 for t in tickets for v in t.get())


def _gpu_randn(cp, shape, dt, seed, scale=1.0, loc=0.0):
    """Random data made on the device (float32, then rounded to dt there): no host RNG for big arrays."""
    a = cp.random.RandomState(seed).standard_normal(shape, dtype=cp.float32) * scale + loc
    try:
        return a.astype(dt)
    except Exception:  # pragma: no cover - bfloat16 by integer rounding if CuPy's astype refuses it
        u = a.view(cp.uint32)
        r = (u >> cp.uint32(16)) & cp.uint32(1)
        return ((u + cp.uint32(0x7FFF) + r) >> cp.uint32(16)).astype(cp.uint16).view(dt)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [1, 3, 65, 767, 768, 769, 4097])
def test_forward_many_rows(cp, rng, kind, dt, hidden):
    """>= 70,000 rows (no grid-y limit, neighbouring rows untouched): weight, bias, residual and statistics;
    checks a sample of rows including the first and last ones."""
    rows = 70003
    seed = int(rng.integers(1 << 30))
    x = _gpu_randn(cp, (rows, hidden), dt, seed, 3.0, 5.0)
    r = _gpu_randn(cp, (rows, hidden), dt, seed + 1)
    w = rnd(rng.standard_normal(hidden) * 0.5 + 1, np.float32)
    b = rnd(rng.standard_normal(hidden), np.float32) if kind == "layer" else None
    eps = 1e-5
    out = _call(cp, kind, x, cp.asarray(w), None if b is None else cp.asarray(b), r, eps, True)
    sel = np.unique(np.concatenate([[0, 1, 2, rows - 3, rows - 2, rows - 1], rng.integers(0, rows, 64)]))
    xs, rs_ = x[sel].get(), r[sel].get()
    hs = (xs.astype(np.float32) + rs_.astype(np.float32)).astype(dt)
    assert np.array_equal(out[1][sel].get().view(np.uint8), hs.view(np.uint8))
    ref, mean, rstd = ref_forward(kind, hs.astype(np.float64), w, b, eps)
    base = rnd(f32_forward(kind, hs, w, b, eps), dt)
    print(f"{kind} {dt} rows={rows} hidden={hidden}")
    check_close("y", out[0][sel].get(), ref, base, dt, hidden, scale=y_scale(hs, rstd, w))
    np.testing.assert_allclose(out[-1][sel].get(), rstd, rtol=1e-4)
    if kind == "layer":
        np.testing.assert_allclose(out[2][sel].get(), mean, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_handed_cases(cp, rng):
    for c in CASES:
        cid = c["id"]
        print(cid)
        if cid == "ln-large-mean":
            x = cp.asarray(np.array(c["input"]["x"], np.float32))
            y = norm.layer_norm(x, c["kwargs"]["normalized_shape"], eps=c["kwargs"]["eps"]).get()
            np.testing.assert_allclose(y, c["expect"], atol=c["tolerance"]["atol"])
            # the whole kind: large mean against small spread, every dtype that can hold it
            for dt in (np.float32, _dtypes.bfloat16, np.float16):
                _run_forward(cp, rng, "layer", np.dtype(dt), 5, 1000, 2, loc=2000.0 if dt == np.float16 else 3e4,
                             scale=1.0 if dt == np.float16 else 100.0)
        elif cid == "rms-fp16-large":
            x = rng.uniform(300, 600, (4, 4096)) * rng.choice([-1.0, 1.0], (4, 4096))
            xh = x.astype(np.float16)
            y = norm.rms_norm(cp.asarray(xh), [4096]).get()
            assert np.isfinite(y.astype(np.float32)).all()
            ref = reference.rms_norm(xh, [4096], eps=E32)[0]  # eps=None: float32's (as torch)
            base = rnd(f32_forward("rms", xh, eps=E32), np.float16)
            check_close("y", y, ref, base, np.float16, 4096)
            for hidden in (4096, 4097, 65537):  # every path (registers, shared memory) accumulates in float32
                xx = (rng.uniform(300, 60000, (2, hidden)) * rng.choice([-1.0, 1.0], (2, hidden))).astype(np.float16)
                yy = norm.rms_norm(cp.asarray(xx), hidden).get()
                assert np.isfinite(yy.astype(np.float32)).all(), hidden
        elif cid == "ln-empty":
            for fn in (norm.layer_norm, norm.rms_norm):
                y = fn(cp.empty((0, 1024), np.float32), [1024])
                assert y.shape == (0, 1024)
                y, h, *st = fn(cp.empty((0, 1024), np.float32), [1024], residual=cp.empty((0, 1024), np.float32),
                               return_stats=True)
                assert y.shape == h.shape == (0, 1024) and all(s.shape == (0,) for s in st)
                with pytest.raises(ValueError, match="no elements"):
                    fn(cp.empty((8, 0), np.float32), [0])
        elif cid == "ln-odd-hidden":
            for hidden in (1, 3, 767, 768, 769, 1535, 1536, 4097, 65537):
                for dt in DTYPES:
                    for kind in ("layer", "rms"):
                        for rows in (1, 7):
                            for variant in (0, 3):
                                _run_forward(cp, rng, kind, np.dtype(dt), rows, hidden, variant)
            # rows 70000: test_forward_many_rows


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("cluster", [True, "hold", 2, False],  # (prefetch 3 differs from 2 in launch bounds only)
                         ids=["cluster", "cluster-hold", "cluster-hold-prefetch2", "no-cluster"])
def test_forward_cluster_edges(cp, rng, monkeypatch, kind, dt, cluster):
    """The cluster forward (norm_fwd_cluster, compute capability 9.0; ``cluster-hold``: its persistent form with
    the weights held, FWD_CLUSTER_HOLD, also over more rows than clusters; ``cluster-hold-prefetchN``: that form
    loading each next row during the current one, FWD_CLUSTER_PREFETCH = N) at the edges of its plan: rows of 4096
    vectors (4 blocks of 256 threads), 4097 (8 blocks of 160 threads, the last owning nothing), 8192 (8 of 256),
    8193 (not taken); and with the threshold lowered, 1100 vectors (2 blocks of 160, the second partly empty) and
    2048 (2 of 256); 1, 7 and 301 rows. ``no-cluster``: the same rows on the other forward paths (streamed,
    shared-memory chunks), which the cluster path now hides at these lengths."""
    if cluster and int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("thread-block clusters need compute capability 9.0")
    monkeypatch.setattr(norm, "FWD_CLUSTER_SIZES", (2, 4, 8) if cluster else ())
    monkeypatch.setattr(norm, "FWD_CLUSTER_MIN_VECS", 1024)
    monkeypatch.setattr(norm, "FWD_CLUSTER_PLAIN_LAYER", True)  # the kernel's LayerNorm without residual too
    monkeypatch.setattr(norm, "FWD_CLUSTER_RMS32_WHOLE", True)  # and float32 RMSNorm rows of <= 2048 vectors
    held = cluster == "hold" or cluster in (2, 3)
    monkeypatch.setattr(norm, "FWD_CLUSTER_HOLD", held)
    monkeypatch.setattr(norm, "FWD_CLUSTER_PREFETCH", cluster if held and cluster != "hold" else 0)
    vec = 16 // np.dtype(dt).itemsize
    for body in (1100, 2048, 4096, 4097, 8192, 8193):
        # held: more rows than the persistent grid has clusters (each cluster takes several, both buffers)
        # held, longer rows: 301 rows give each of the < 100 clusters of 8 blocks (4097: 160-thread blocks, up to
        # 6 an SM) three or more (prefetch: a next row loaded at every cluster size, and with the last block empty)
        for rows in ((1, 7, 1237) if held and body <= 4096 else (1, 7, 301) if held else (1, 7) if body > 2048
                     else (1, 301)):
            # 1237 rows: the first and last 48 rows and 160 drawn between them are checked against the float64
            # reference (every row is written; the reference of all of them made this the suite's slowest test)
            check = (None if rows < 1237 else
                     np.r_[0:48, np.sort(rng.choice(np.arange(48, rows - 48), 160, replace=False)), rows - 48:rows])
            for variant in (0, 1, 2, 3, 4, 5) if held else (0, 1, 2, 3, 5):
                _run_forward(cp, rng, kind, dt, rows, body * vec, variant, check_rows=check)
    if cluster:
        assert norm._fwd_config(norm.LAYER if kind == "layer" else norm.RMS, np.dtype(dt), np.dtype(dt),
                                4096 * vec, False, cp.cuda.Device().id).cluster == 4


@pytest.mark.gpu
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_layer_norm_without_affine_on_the_cluster_path(cp, rng, dt):
    """Default settings: LayerNorm without weight, bias or residual over 2 and 4 cluster blocks (2048 and 4096
    vectors, and 4095 with the last block's share short) takes norm_fwd_cluster on compute capability 9.0; the
    results match the float64 reference on 1, 7 and 301 rows."""
    vec = 16 // np.dtype(dt).itemsize
    for body in (2048, 4095, 4096):
        if int(cp.cuda.Device().compute_capability) >= 90:
            plan = norm._fwd_config(norm.LAYER, np.dtype(dt), np.dtype(dt), body * vec, False, cp.cuda.Device().id,
                                    affine=False)
            assert plan.cluster in (2, 4), plan
        for rows in (1, 7, 301):
            _run_forward(cp, rng, "layer", dt, rows, body * vec, 0)
        # mean and rstd on this path (variant 0 asks for no statistics)
        x = rnd(rng.standard_normal((5, body * vec)) * 3 + 5, dt)
        _, mk, rk = norm.layer_norm(_dev(cp, x), body * vec, return_stats=True)
        _, mean, rstd = ref_forward("layer", x.astype(np.float64), None, None, 1e-5)
        assert np.allclose(mk.get(), mean, rtol=1e-5, atol=1e-5) and np.allclose(rk.get(), rstd, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_layer_norm_cluster_weight_and_bias_forms(cp, rng, monkeypatch, dt):
    """The cluster forward's four output loops (cluster_emit: weight and bias, weight only, bias only, neither),
    weights of x's dtype staged in shared memory per row (and float32 weights of a 16-bit row, read per use):
    LayerNorm rows of 2048 vectors (2 cluster blocks on compute capability 9.0; by FWD_CLUSTER_LAYER_AFFINE, and
    forced), 4096 (4 blocks, forced) and 4095 (the last block's share short), 1, 7 and 301 rows, each row drawn
    with its own offset and scale, against the float64 reference; and the register kernel's two output loops
    (norm_fwd: its own for weight and bias) at 1024 vectors."""
    cc = int(cp.cuda.Device().compute_capability)
    vec = 16 // np.dtype(dt).itemsize
    for body, forced in ((2048, False), (2048, True), (4095, True), (4096, True), (1024, False)):
        hidden = body * vec
        monkeypatch.setattr(norm, "FWD_CLUSTER_PLAIN_LAYER", forced)
        monkeypatch.setattr(norm, "FWD_CLUSTER_LAYER_AFFINE", 2 if body == 2048 else 0)
        for wdt in sorted({np.dtype(dt), np.dtype(np.float32)}, key=str):
            if cc >= 90 and wdt == np.dtype(dt):
                plan = norm._fwd_config(norm.LAYER, np.dtype(dt), wdt, hidden, False, cp.cuda.Device().id)
                assert (plan.cluster in (2, 4) and plan.smem > 0) if body > 1024 else not plan.cluster, plan
            for rows in (1, 7, 301):
                x = rnd(rng.standard_normal((rows, hidden)) * rng.uniform(0.5, 4, (rows, 1))
                        + rng.uniform(-8, 8, (rows, 1)), dt)
                w = rnd(rng.standard_normal(hidden) * 0.5 + 1, wdt)
                b = rnd(rng.standard_normal(hidden), wdt)
                for ww, bb in ((w, b), (w, None), (None, b), (None, None)):
                    y = norm.layer_norm(_dev(cp, x), hidden, None if ww is None else _dev(cp, ww),
                                        None if bb is None else _dev(cp, bb)).get()
                    ref, _, rstd = ref_forward("layer", x.astype(np.float64), ww, bb, 1e-5)
                    base = rnd(f32_forward("layer", x, ww, bb, 1e-5), dt)
                    check_close(f"y w={ww is not None} b={bb is not None} {wdt} rows={rows} body={body}", y, ref,
                                base, dt, hidden, scale=y_scale(x, rstd, ww))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("hidden,cluster", [(1031, True), (32768, True), (32768, False), (40001, True)],
                         ids=["registers", "cluster", "stream-or-smem", "smem"])
def test_extreme_inputs(cp, rng, monkeypatch, kind, dt, hidden, cluster):
    monkeypatch.setattr(norm, "FWD_CLUSTER_SIZES", (2, 4, 8) if cluster else ())
    monkeypatch.setattr(norm, "FWD_CLUSTER_PLAIN_LAYER", True)
    big = {np.dtype(np.float32): 1e15, np.dtype(np.float16): 3e4, _dtypes.bfloat16: 1e15}[np.dtype(dt)]
    x = rng.standard_normal((6, hidden)) * 3
    x[0] = 2.5                    # all equal: var = 0 -> y = bias, rstd = 1/sqrt(eps)
    x[1] *= big / 10              # huge values
    x[2] = rng.choice([-big, big], hidden)
    x[3, 17] = np.nan             # NaN poisons its row only
    x[4, 5] = np.inf              # inf makes its row NaN (inf - inf), as the reference
    x[5] *= 1e-3                  # tiny spread
    xd = rnd(x, dt)
    w = rnd(rng.standard_normal(hidden), dt)
    b = rnd(rng.standard_normal(hidden), dt) if kind == "layer" else None
    eps = 1e-5
    out = _call(cp, kind, cp.asarray(xd), cp.asarray(w), None if b is None else cp.asarray(b), None, eps, True)
    y = out[0].get()
    with np.errstate(all="ignore"):
        ref = ref_forward(kind, xd.astype(np.float64), w, b, eps)[0]
        base = rnd(f32_forward(kind, xd, w, b, eps), dt)
    check_close("y", y[[0, 1, 2, 5]], ref[[0, 1, 2, 5]], base[[0, 1, 2, 5]], dt, hidden)
    assert np.isnan(y[3].astype(np.float32)).all()
    if kind == "layer":  # inf - inf: the whole row is NaN
        assert np.isnan(y[4].astype(np.float32)).all()
    else:  # rstd = 1/sqrt(inf) = 0: zeros, NaN (inf * 0) at the inf
        y4 = y[4].astype(np.float32)
        assert np.isnan(y4[5]) and (np.delete(y4, 5) == 0).all()
    np.testing.assert_array_equal(np.isnan(y[3:5].astype(np.float32)), np.isnan(ref[3:5]))
    if kind == "layer":
        np.testing.assert_array_equal(y[0], b)
        np.testing.assert_allclose(out[2].get()[0], 1 / math.sqrt(eps), rtol=1e-6)


@pytest.mark.gpu
def test_higher_rank_and_strided_inputs(cp, rng):
    x = rnd(rng.standard_normal((3, 5, 4, 33)), np.float32)
    w = rnd(rng.standard_normal((4, 33)), np.float32)
    b = rnd(rng.standard_normal((4, 33)), np.float32)
    y, mean, rstd = norm.layer_norm(cp.asarray(x), (4, 33), cp.asarray(w), cp.asarray(b), return_stats=True)
    ref, m, r, _ = reference.layer_norm(x, (4, 33), w, b)
    assert mean.shape == (3, 5) and rstd.shape == (3, 5)
    np.testing.assert_allclose(y.get(), ref, rtol=1e-5, atol=1e-5)
    # a transposed (non-contiguous) view and an offset (misaligned) view give the same as contiguous input
    xt = cp.asarray(rnd(rng.standard_normal((33, 40)), np.float16)).T
    np.testing.assert_array_equal(norm.rms_norm(xt, 33).get(), norm.rms_norm(cp.ascontiguousarray(xt), 33).get())
    flat = cp.asarray(rnd(rng.standard_normal(1 + 5 * 77), _dtypes.bfloat16))
    xo = flat[1:].reshape(5, 77)  # base pointer 2 bytes past an allocation
    np.testing.assert_array_equal(norm.layer_norm(xo, 77).get().view(np.uint16),
                                  norm.layer_norm(xo.copy(), 77).get().view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_rms_norm_default_eps_as_torch(cp, rng, dt):
    """Rows of mean square ~1e-4, where eps decides the result (bfloat16's eps 7.8e-3 would change it 9x): eps=None
    gives the bits of eps=finfo(float32).eps, the float64 reference with that eps, and torch's F.rms_norm default."""
    hidden = 1024
    x = rnd(rng.standard_normal((8, hidden)) * 1e-2, dt)
    w = rnd(rng.standard_normal(hidden) * 0.5 + 1, dt)
    y = norm.rms_norm(cp.asarray(x), (hidden,), cp.asarray(w))
    np.testing.assert_array_equal(y.view(cp.uint8).get(),
                                  norm.rms_norm(cp.asarray(x), (hidden,), cp.asarray(w), eps=E32).view(cp.uint8).get())
    ref = ref_forward("rms", x, w, eps=E32)[0]
    check_close("y", y.get(), ref, rnd(f32_forward("rms", x, w, eps=E32), dt), dt, hidden)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    tdt = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}.get(np.dtype(dt), torch.bfloat16)
    tx = torch.tensor(x.astype(np.float32), device="cuda").to(tdt)
    tw = torch.tensor(w.astype(np.float32), device="cuda").to(tdt)
    ty = F.rms_norm(tx, (hidden,), tw).float().cpu().numpy()  # torch's eps=None
    diff = float(np.abs(y.get().astype(np.float64) - ty).max())
    print(f"rms_norm {dt} eps=None: max |cuflash - torch| {diff:.3g}")
    assert diff <= 4 * _dtypes.eps(dt) * float(np.abs(ref).max()), diff


# ------------------------------------------------------------------------------------------------------------
# backward
def _run_backward(cp, rng, kind, dt, rows, hidden, wdt="same", with_weight=True):
    x = rnd(rng.standard_normal((rows, hidden)) * 2 + 3, dt)
    dy = rnd(rng.standard_normal((rows, hidden)), dt)
    wd = dt if wdt == "same" else np.dtype(wdt)
    w = rnd(rng.standard_normal(hidden) * 0.5 + 1, wd) if with_weight else None
    eps = 1e-5
    _, mean, rstd = ref_forward(kind, x.astype(np.float64), None, None, eps)
    mean32 = mean.astype(np.float32) if mean is not None else None
    rstd32 = rstd.astype(np.float32)
    wc = cp.asarray(w) if w is not None else None
    if kind == "layer":
        dx, dw, db = norm.layer_norm_backward(cp.asarray(dy), cp.asarray(x), wc, cp.asarray(mean32),
                                              cp.asarray(rstd32))
    else:
        dx, dw = norm.rms_norm_backward(cp.asarray(dy), cp.asarray(x), wc, cp.asarray(rstd32))
        db = None
    rdx, rdw, rdb = ref_backward(kind, dy, x, w, mean32, rstd32)
    bdx, bdw, bdb = f32_backward(kind, dy, x, w, mean32, rstd32)
    print(f"{kind} backward {dt} w={None if w is None else w.dtype} rows={rows} hidden={hidden}")
    assert dx.dtype == dt and dx.shape == x.shape
    check_close("dx", dx.get(), rdx, rnd(bdx, dt), dt, hidden)
    # column sums over rows: float32 partials; floor ~ rows * eps32 at the scale of sum |terms|
    xhat = (x.astype(np.float64) - (mean32[:, None] if kind == "layer" else 0)) * rstd32[:, None]
    if w is not None:
        assert dw.dtype == wd and dw.shape == (hidden,)
        scale = float(np.abs(dy.astype(np.float64) * xhat).sum(0).max())
        check_close("dweight", dw.get(), rdw, rnd(bdw, wd), wd, rows, scale=scale)
    else:
        assert dw is None
    if kind == "layer":
        bdt = wd if w is not None else np.dtype(np.float32)
        assert db.dtype == bdt and db.shape == (hidden,)
        scale = float(np.abs(dy.astype(np.float64)).sum(0).max())
        check_close("dbias", db.get(), rdb, rnd(bdb, bdt), bdt, rows, scale=scale)
    return dx, dw, db


# the streamed backward (norm_bwd_stream) takes whole-vector rows of 64..2048 vectors (two a thread up to 1024, four
# beyond), the cluster one (sm_90) up to 8 x 2048: 504 (63 bf16 vectors), 512, 256 (64 float32 vectors), 4100 (1025
# float32 vectors), 8200 (1025 bf16 vectors), 8196 (2049 float32 vectors: a cluster of 2), 16384 (2048 bf16
# vectors), 16392 (2049 bf16 vectors), 32768 (4096 bf16 vectors: 2 blocks; 8192 float32: 4), 32776 (4097 bf16: 4
# blocks), 65536 (8192 bf16: 4 blocks; 16384 float32: 8), 65544 (8193 bf16: 8 blocks) sit at their edges
BWD_HIDDEN = [1, 3, 8, 9, 127, 129, 256, 504, 512, 767, 768, 769, 1024, 1025, 2048, 4096, 4097, 4100, 8192, 8193,
              8196, 8200, 16384, 16385, 16392, 32768, 32776, 40001, 65536, 65544, 70001]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", BWD_HIDDEN)
def test_backward_matches_reference(cp, rng, kind, dt, hidden):
    rows = 37 if hidden <= 20000 else 9
    _run_backward(cp, rng, kind, dt, rows, hidden)
    _run_backward(cp, rng, kind, dt, 5, hidden, wdt=np.float32)
    _run_backward(cp, rng, kind, dt, 3, hidden, with_weight=False)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("rows,hidden", [(50021, 64), (20011, 512), (30011, 1024), (20011, 769), (4099, 4096),
                                         (2003, 8192), (1009, 16384), (1009, 32768), (301, 40000)])
def test_backward_many_rows_deterministic(cp, rng, kind, rows, hidden):
    """Many rows per block and many blocks (and the workspace-row accumulators of huge rows): partial sums,
    the second reduction, bitwise reproducible from call to call."""
    dt = _dtypes.bfloat16
    _run_backward(cp, rng, kind, dt, rows, hidden, wdt=np.float32)
    x = cp.asarray(rnd(rng.standard_normal((rows, hidden)), dt))
    dy = cp.asarray(rnd(rng.standard_normal((rows, hidden)), dt))
    w = cp.asarray(rnd(rng.standard_normal(hidden), np.float32))
    rs = cp.ones(rows, np.float32)
    mu = cp.zeros(rows, np.float32)
    f = (lambda: norm.layer_norm_backward(dy, x, w, mu, rs)) if kind == "layer" else (
        lambda: norm.rms_norm_backward(dy, x, w, rs))
    a, b = f(), f()
    for u, v in zip(a, b):
        if u is not None:
            assert np.array_equal(u.get().view(np.uint8), v.get().view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "registers"])
def test_backward_paths_few_and_many_rows(cp, rng, monkeypatch, kind, stream):
    """Both backward kernels on row lengths the streamed one takes (512, 1000, 2048, 4096; 2048 vectors with four
    a thread; 4097 vectors over a cluster of 4 blocks on the H100/H200, uneven shares) and one it does not (1001:
    not whole vectors), with fewer rows than a block has groups (their partial dw/db rows must still be
    written), rows that do not fill the last wave, and a float32 weight. Every float32 and 16-bit buffer the
    wrappers allocate (workspace, dx, dweight, dbias) starts as NaN, so an element no kernel writes shows."""
    monkeypatch.setattr(norm, "BWD_STREAM", stream)
    empty = cp.empty

    def nan_empty(shape, dtype=float, *args, **kwargs):
        a = empty(shape, dtype, *args, **kwargs)
        d = np.dtype(float if dtype is None else dtype)
        if d == _dtypes.bfloat16:
            a.view(np.uint16).fill(0x7FC0)  # a bfloat16 NaN
        elif d.kind == "f":
            poison(a)
        return a

    monkeypatch.setattr(cp, "empty", nan_empty)
    for dt in (np.dtype(np.float32), _dtypes.bfloat16):
        vec = 16 // dt.itemsize
        for hidden in (512, 1000, 1001, 2048, 4096, 2048 * vec, 4097 * vec):
            geo = norm._bwd_stream_geometry(dt.itemsize, hidden, 90)
            assert (geo is not None) == (stream and hidden % vec == 0 and hidden // vec <= 8 * 2048)
            for rows in (1, 3, 1237 if hidden <= 16384 else 263):  # 263: several rows per cluster
                _run_backward(cp, rng, kind, dt, rows, hidden, wdt=np.float32 if rows == 3 else "same")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_gradients_against_finite_differences(cp, rng, kind):
    """Kernel gradients (float32, with statistics from the kernel forward) vs central differences of the
    float64 reference forward, small shapes."""
    for rows, hidden in ((3, 5), (2, 33), (4, 130)):
        x = rng.standard_normal((rows, hidden)) * 2 + 1
        w = rng.standard_normal(hidden)
        b = rng.standard_normal(hidden) if kind == "layer" else None
        dy = rng.standard_normal((rows, hidden))
        eps = 1e-5
        x32, w32, dy32 = (a.astype(np.float32) for a in (x, w, dy))
        args = (cp.asarray(x32), (hidden,), cp.asarray(w32))
        if kind == "layer":
            _, mean, rstd = norm.layer_norm(*args, cp.asarray(b.astype(np.float32)), eps, return_stats=True)
            dx, dw, db = norm.layer_norm_backward(cp.asarray(dy32), cp.asarray(x32), cp.asarray(w32), mean, rstd)
        else:
            _, rstd = norm.rms_norm(*args, eps, return_stats=True)
            dx, dw = norm.rms_norm_backward(cp.asarray(dy32), cp.asarray(x32), cp.asarray(w32), rstd)
        xr = x32.astype(np.float64)
        wr = w32.astype(np.float64)

        def loss(xx, ww):
            return float((ref_forward(kind, xx, ww, b, eps)[0] * dy32).sum())

        step = 1e-5
        fdx = np.zeros_like(xr)
        for i in np.ndindex(xr.shape):
            e = np.zeros_like(xr)
            e[i] = step
            fdx[i] = (loss(xr + e, wr) - loss(xr - e, wr)) / (2 * step)
        fdw = np.array([(loss(xr, wr + step * np.eye(hidden)[j]) - loss(xr, wr - step * np.eye(hidden)[j]))
                        / (2 * step) for j in range(hidden)])
        print(kind, rows, hidden, "dx err", np.abs(dx.get() - fdx).max(), "dw err", np.abs(dw.get() - fdw).max())
        np.testing.assert_allclose(dx.get(), fdx, rtol=1e-4, atol=1e-4 * np.abs(fdx).max())
        np.testing.assert_allclose(dw.get(), fdw, rtol=1e-4, atol=1e-4 * np.abs(fdw).max())
        if kind == "layer":
            np.testing.assert_allclose(db.get(), dy32.sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_64bit_offsets(cp, rng):
    """rows * hidden > 2^31 elements: the last rows land beyond 32-bit offsets."""
    free = cp.cuda.runtime.memGetInfo()[0]
    rows, hidden = 2 ** 31 // 4096 + 3, 4096
    n = rows * hidden
    if free < 6 * n * 2 + (4 << 30):
        pytest.skip(f"needs ~{6 * n * 2 >> 30} GiB free, {free >> 30} GiB free")
    x = cp.empty((rows, hidden), np.float16)
    x[-8:] = cp.asarray(rnd(rng.standard_normal((8, hidden)) * 2 + 1, np.float16))
    x[:-8] = 1
    y, mean, rstd = norm.layer_norm(x, hidden, return_stats=True)
    ref = reference.layer_norm(x[-8:].get(), (hidden,))[0]
    np.testing.assert_allclose(y[-8:].get().astype(np.float32), ref, atol=2e-2, rtol=1e-2)
    dx, dw, db = norm.layer_norm_backward(x, x, None, mean, rstd)
    rdx = ref_backward("layer", x[-8:].get(), x[-8:].get(), None, mean[-8:].get(), rstd[-8:].get())[0]
    # dy = x makes dx cancel to ~0 (x - mean - xhat*mean(x*xhat)/rstd = 0 analytically): judge the float32
    # cancellation against the size of the terms, rstd*|dy|, not against the tiny result.
    terms = float(rstd[-8:].get().max()) * float(np.abs(x[-8:].get().astype(np.float32)).max())
    np.testing.assert_allclose(dx[-8:].get().astype(np.float32), rdx, atol=1e-5 * terms, rtol=1e-2)
    del x, y, dx


# ------------------------------------------------------------------------------------------------------------
# bad input
@pytest.mark.gpu
def test_bad_input_raises_before_launch(cp):
    x = cp.ones((4, 16), np.float32)
    with pytest.raises(ValueError, match=r"\(4, 16\)"):
        norm.layer_norm(x, (8,))
    with pytest.raises(ValueError, match="trailing"):
        norm.rms_norm(x, (4, 4, 16))
    with pytest.raises(ValueError, match="weight has shape"):
        norm.layer_norm(x, 16, cp.ones(15, np.float32))
    with pytest.raises(ValueError, match="bias has shape"):
        norm.layer_norm(x, 16, None, cp.ones((1, 16), np.float32))
    with pytest.raises(TypeError, match="float64"):
        norm.layer_norm(x, 16, cp.ones(16, np.float64))
    with pytest.raises(TypeError, match="float16"):
        norm.rms_norm(x, 16, cp.ones(16, np.float16))  # float16 weight with float32 input
    with pytest.raises(TypeError, match="int32"):
        norm.layer_norm(cp.ones((4, 16), np.int32), 16)
    with pytest.raises(TypeError, match="float64"):
        norm.rms_norm(cp.ones((4, 16), np.float64), 16)
    with pytest.raises(TypeError, match="same dtype"):
        xh = cp.ones((4, 16), np.float16)
        norm.layer_norm(xh, 16, cp.ones(16, np.float16), cp.ones(16, np.float32))
    with pytest.raises(ValueError, match="residual"):
        norm.layer_norm(x, 16, residual=cp.ones((4, 15), np.float32))
    with pytest.raises(TypeError, match="residual"):
        norm.layer_norm(x, 16, residual=cp.ones((4, 16), np.float16))
    with pytest.raises(TypeError, match="dy"):
        norm.rms_norm_backward(cp.ones((4, 16), np.float16), x, None, cp.ones(4, np.float32))
    with pytest.raises(ValueError, match="eps"):
        norm.layer_norm(x, 16, eps=-1.0)
    rs = cp.ones(4, np.float32)
    with pytest.raises(ValueError, match="dy"):
        norm.layer_norm_backward(cp.ones((4, 15), np.float32), x, None, rs, rs)
    with pytest.raises(ValueError, match="rstd"):
        norm.rms_norm_backward(x, x, None, cp.ones(5, np.float32))
    with pytest.raises(TypeError, match="rstd"):
        norm.rms_norm_backward(x, x, None, cp.ones(4, np.float64))
    with pytest.raises(ValueError, match="mean"):
        norm.layer_norm_backward(x, x, None, cp.ones(3, np.float32), rs)
    with pytest.raises(ValueError, match="weight has shape"):
        norm.rms_norm_backward(x, x, cp.ones(8, np.float32), rs)


@pytest.mark.gpu
def test_outputs_are_fully_written(cp, rng):
    """Outputs come from fresh buffers: poison the allocator's pool and check that no NaN survives."""
    for hidden in (5, 769, 16385):
        junk = poison(cp.empty((9, hidden), np.float32))
        del junk  # the pool hands this memory back to the next allocation of the same size
        x = cp.asarray(rnd(rng.standard_normal((9, hidden)), np.float32))
        y, h = norm.rms_norm(x, hidden, residual=x)
        assert not cp.isnan(y).any() and not cp.isnan(h).any()
