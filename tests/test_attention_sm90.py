"""The Hopper (sm_90a, wgmma) attention forward against a float64 reference, by the FlashAttention rule.

Rule: max |out - ref64| <= 2 * max |base - ref64| + 1e-5, ``base`` a straightforward same-precision
implementation (scores and P rounded to the input dtype, fp32 matmul accumulation). Every case prints the
kernel's and the baseline's max / mean error before asserting. The float64 reference runs on the GPU with CuPy
(checked against :func:`cuflash.reference.attention` on small cases) so that 2048 x 2048 stays fast.
GPU tests need compute capability 9.0 (H100 / H200); they skip elsewhere.

Every kernel variant ("ws": warp-specialised + ping-pong, "ws_nopp", "simple") runs the same cases. Before the
first GPU test, each instantiation is compiled and launched on a few shapes in its own subprocess, all in
parallel (``_attention_sm90.self_check``, a canary): it fills CuPy's kernel cache, and a variant that hangs (a
barrier deadlock) or crashes (an illegal address poisons the CUDA context) fails its tests with the canary's
message instead of taking the whole session down.
"""
import os

import numpy as np
import pytest

from cuflash import _attention_sm90 as S90
from cuflash import _dtypes, reference
from cuflash._attn_common import prepare

from attn_helpers import baseline, randn, ref64

F16, BF16 = _dtypes.float16, _dtypes.bfloat16
DTYPES = [F16, BF16]
SHAPES = [(1, 1), (1, 239), (113, 203), (127, 513), (1023, 1024), (1024, 1023), (192, 192), (2048, 2048)]
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "local": (False, (77, 13))}


def _is_sm90():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0 and cupy.cuda.Device(0).compute_capability == "90"
    except Exception:
        return False


# ------------------------------------------------------------------------------------------------ canary
_CANARY: dict = {}


def _self_check_once():
    """S90.self_check() once per test run: under pytest-xdist the first worker runs it (an exclusive file lock)
    and leaves the result in a file named after the run that the other workers read (each worker running its
    own canary made 16 copies of every compile compete; on the H200 the last waves then ran out of time)."""
    import fcntl
    import json
    import tempfile

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return S90.self_check()
    path = os.path.join(tempfile.gettempdir(), f"cuflash_sm90_canary_{run}.json")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.path.exists(path):
                with open(path) as f:
                    return {tuple(e["key"]): e["msg"] for e in json.load(f)}
            res = S90.self_check()
            with open(path, "w") as f:
                json.dump([{"key": list(k), "msg": v} for k, v in res.items()], f)
            return res
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_canaries():
    """Compile + launch every instantiation in parallel subprocesses (S90.self_check); once per test run."""
    if not _CANARY:
        try:
            _CANARY.update(_self_check_once())
        except Exception as e:  # the check itself could not run: test in-process, unprotected
            print(f"sm90 self-check could not run: {e!r}")
            _CANARY["ran"] = None
        print("sm90 canaries:", {k: ("ok" if v is None else v[:200]) for k, v in _CANARY.items()})
    return _CANARY


def require(dtype, head_dim, variant, block_sizes=None, pv_n=None, seqlen_q=0, seqlen_k=0):
    """Fail (without launching) when the canary of this configuration hung or crashed."""
    d = S90.kernel_head_dim(head_dim)
    variant = S90.pick_variant(variant, head_dim, block_sizes, pv_n)
    if block_sizes is None:
        br, bc, pv = S90.default_tile(variant, d, seqlen_q, seqlen_k)
    else:
        br, bc = block_sizes
        pv = pv_n if pv_n is not None else next((c[2] for c in S90.TILES[(variant, d)] if c[:2] == (br, bc)), 64)
    msg = _run_canaries().get(S90.config_key(dtype, d, variant, br, bc, pv))
    if msg and "OutOfMemoryError" in msg:  # the canary could not get GPU memory: no verdict on the kernel
        print(f"canary of {variant} d{d} ran out of device memory (other test processes); testing in-process")
    elif msg:
        pytest.fail(f"{variant} {np.dtype(dtype).name} d{d} ({br}, {bc}, {pv}): {msg}")


# ------------------------------------------------------------------------------------------------ helpers
def run(q, k, v, causal=False, scale=None, window=(-1, -1), variant=None, **kw):
    variant = variant or S90.DEFAULT_VARIANT
    p = prepare(q, k, v, causal=causal, softmax_scale=scale, window_size=window)
    require(q.dtype, q.shape[-1], variant, kw.get("block_sizes"), kw.get("pv_n"), q.shape[-2], k.shape[-2])
    assert S90.supports(p)
    return S90.forward(p, return_lse=True, variant=variant, **kw)


def check(q, k, v, causal=False, scale=None, window=(-1, -1), what="", variant=None, **kw):
    """Run the sm90 kernel, compare with the float64 reference and the same-precision baseline."""
    import cupy as cp

    variant = variant or S90.DEFAULT_VARIANT
    what = f"[{variant}] {what}"
    out, lse = run(q, k, v, causal, scale, window, variant=variant, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and out.flags.c_contiguous
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    ro, rl = ref64(q, k, v, causal, scale, window)
    bo = baseline(q, k, v, causal, scale, window)
    o64 = out.astype(cp.float64)
    n_nan = int(cp.isnan(o64).sum())
    err = cp.abs(o64 - ro)
    berr = cp.abs(bo.astype(cp.float64) - ro)
    e_max, e_mean, b_max, b_mean = (float(x) for x in (err.max(), err.mean(), berr.max(), berr.mean()))
    print(f"{what}: kernel max {e_max:.3e} mean {e_mean:.3e} | baseline max {b_max:.3e} mean {b_mean:.3e}"
          f" | NaN {n_nan}")
    assert n_nan == 0, f"{what}: {n_nan} NaN in output"
    assert e_max <= 2 * b_max + 1e-5, f"{what}: max error {e_max:.3e} > 2 x baseline {b_max:.3e} + 1e-5"
    inf_k, inf_r = cp.isneginf(lse), cp.isneginf(rl)
    assert bool(cp.all(inf_k == inf_r)), f"{what}: {int((inf_k != inf_r).sum())} rows differ in lse == -inf"
    fin = cp.isfinite(rl)
    le = float(cp.abs(cp.where(fin, lse.astype(cp.float64) - rl, 0.0)).max())
    tol = 2e-2 * max(1.0, float(cp.abs(cp.where(fin, rl, 0.0)).max()))
    print(f"{what}: lse max error {le:.3e} (tol {tol:.3e})")
    assert le <= tol, f"{what}: lse error {le:.3e} > {tol:.3e}"
    return out, lse


# ------------------------------------------------------------------------------------------------ CPU tests
class _FakeArray:
    """The attributes tensor_map reads of a CuPy array (shape, strides in bytes, dtype, data pointer)."""

    def __init__(self, shape, strides, ptr=1 << 20, dtype=BF16):
        self.shape, self.strides, self.ndim = tuple(shape), tuple(strides), len(shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize

        class _Ptr:
            pass

        self.data = _Ptr()
        self.data.ptr = ptr


def test_tensor_map_arguments_and_refusals(monkeypatch):
    """tensor_map describes (B, H, S, d) as the 4-D map (d, S, H, B) with byte strides of S, H, B, a 64 x Bc box
    and the 128-byte swizzle; it declines (None) what TMA cannot read, without calling the driver."""
    import ctypes

    calls = []

    def fake_encode(out, dtype, rank, ptr, dims, strides, box, estr, inter, swz, l2, oob):
        calls.append(dict(dtype=dtype, rank=rank, ptr=ptr, dims=list(dims[:4]), strides=list(strides[:3]),
                          box=list(box[:4]), estr=list(estr[:4]), swizzle=swz, oob=oob))
        ctypes.memset(out, 0xAB, 128)  # the driver fills the 128 opaque bytes
        return 0

    S90._tensor_map.cache_clear()  # maps are cached by (pointer, dtype, shape, strides, box)
    monkeypatch.setattr(S90, "_encode_fn", lambda: fake_encode)
    B, H, S, d = 2, 3, 100, 128
    m = S90.tensor_map(_FakeArray((B, H, S, d), (H * S * d * 2, S * d * 2, d * 2, 2)), 128)
    assert m is not None and m.dtype.itemsize == 128 and m.shape == (1,) and m.tobytes() == b"\xab" * 128
    c = calls.pop()
    assert c["dims"] == [d, S, H, B] and c["strides"] == [d * 2, S * d * 2, H * S * d * 2]
    assert c["box"] == [64, 128, 1, 1] and c["estr"] == [1, 1, 1, 1] and c["swizzle"] == 3 and c["oob"] == 0
    assert c["rank"] == 4 and c["dtype"] == 9 and c["ptr"] == 1 << 20
    # a (batch, seqlen, heads, head_dim) view: strides out of order are fine
    S90.tensor_map(_FakeArray((B, H, S, 64), (S * H * 64 * 2, 64 * 2, H * 64 * 2, 2), dtype=F16), 64)
    c = calls.pop()
    assert c["dims"] == [64, S, H, B] and c["strides"] == [H * 64 * 2, 64 * 2, S * H * 64 * 2] and c["dtype"] == 6
    # a size-one dimension may carry any stride: a valid one is given instead
    S90.tensor_map(_FakeArray((1, 1, S, d), (7, 0, d * 2, 2)), 128)
    c = calls.pop()
    assert c["strides"] == [d * 2, S * d * 2, S * d * 2]
    # refused: broadcast (stride 0), negative or unaligned strides, unaligned data, strided last axis
    for shape, strides, ptr in [((2, H, S, d), (0, S * d * 2, d * 2, 2), 1 << 20),
                                ((B, H, S, d), (H * S * d * 2, S * d * 2, -d * 2, 2), 1 << 20),
                                ((B, H, S, d), (H * S * d * 2, S * d * 2, d * 2 + 2, 2), 1 << 20),
                                ((B, H, S, d), (H * S * d * 2, S * d * 2, d * 2, 2), (1 << 20) + 8),
                                ((B, H, S, d), (H * S * d * 4, S * d * 4, d * 4, 4), 1 << 20)]:
        assert S90.tensor_map(_FakeArray(shape, strides, ptr), 128) is None, (shape, strides, ptr)
    assert not calls
    # the same buffer again: the cached map, no second driver call
    assert S90.tensor_map(_FakeArray((B, H, S, d), (H * S * d * 2, S * d * 2, d * 2, 2)), 128) is m and not calls
    S90._tensor_map.cache_clear()
    monkeypatch.setattr(S90, "_encode_fn", lambda: (lambda *a: 1))  # the driver refuses
    assert S90.tensor_map(_FakeArray((B, H, S, d), (H * S * d * 2, S * d * 2, d * 2, 2)), 128) is None
    S90._tensor_map.cache_clear()
    monkeypatch.setattr(S90, "_encode_fn", lambda: None)  # no driver entry point
    assert S90.tensor_map(_FakeArray((B, H, S, d), (H * S * d * 2, S * d * 2, d * 2, 2)), 128) is None
    S90._tensor_map.cache_clear()


def test_configurations_fit_h200_shared_memory():
    for (dt, d, var, br, bc, pv) in S90.configurations():
        pin = S90.compile_options(var) == S90.PIN_OPTIONS
        assert S90.smem_bytes(var, d, br, bc, pin) <= 227 * 1024, (dt, d, var, br, bc)
        assert br % 64 == 0 and S90.threads(var, br) <= 1024
        name = S90.kernel_name(dt, d, var, br, bc, pv)
        assert f"<{_dtypes.ctype(dt)}, {d}, {br // 64}, {bc}, {pv}" in name, name


def test_declared_with_sm90a():
    from cuflash import _compile

    decl = [e for e in _compile.declared() if e[0] == S90.SOURCE]
    release = [e for e in decl if e[3]]
    assert len(release) == len(S90.configurations())  # each launched configuration once, with its options
    tma = sum(c[2] in S90.PIN_VARIANTS for c in S90.configurations())
    assert sum(e[2] == S90.PIN_OPTIONS for e in release) == tma  # 'tma' / 'tmap' pinned (the default)
    study = [e for e in decl if not e[3]]  # 'tma' / 'tmap' unpinned (PIN_SOFTMAX = False)
    assert len(study) == tma and all(e[2] == S90.ARCH_OPTIONS for e in study)


def test_group_heads():
    """Longest-first groups: one head at a time unmasked (or with LPT_GROUP_BYTES = 0); masked, as many heads as
    LPT_GROUP_BYTES holds of K and V (per query head: GQA shares them), at most batch x heads."""
    class P:
        batch, heads_q, seqlen_q, seqlen_k, dtype, window, group = 8, 16, 2048, 2048, np.dtype(BF16), (-1, -1), 1

    assert S90.group_heads(P(), 128) == 1
    P.window = (-1, 0)
    assert S90.group_heads(P(), 128) == S90.LPT_GROUP_BYTES // (2 * 2048 * 128 * 2)
    P.group = 4
    assert S90.group_heads(P(), 128) == min(128, 4 * S90.LPT_GROUP_BYTES // (2 * 2048 * 128 * 2))
    P.seqlen_k, P.group = 1 << 22, 1
    assert S90.group_heads(P(), 128) == 1
    P.seqlen_q, P.seqlen_k = S90.LPT_MIN_SEQLEN - 1, 2048
    assert S90.group_heads(P(), 128) == 1


def test_kernel_head_dim_and_choices():
    assert [S90.kernel_head_dim(d) for d in (1, 32, 64, 65, 96, 128)] == [64, 64, 64, 128, 128, 128]
    with pytest.raises(ValueError):
        S90.kernel_head_dim(129)

    class P:  # the fields choose() reads
        head_dim, dtype, seqlen_q, seqlen_k, window = 128, np.dtype(BF16), 512, 1024, (-1, 0)

    assert S90.choose(P(), variant="ws") == ("ws", 128, 128, 64)
    # head_dim 64 (fewer than WIDE_SEQLEN queries): the one-consumer tile up to SHORT_SEQLEN_K keys, Br = 128 beyond
    P.head_dim = 64
    assert P.seqlen_q < S90.WIDE_SEQLEN
    assert S90.choose(P(), variant="tma") == ("tma", 64, 128, 64)
    P.seqlen_k = S90.SHORT_SEQLEN_K + 1
    assert S90.choose(P(), variant="tma") == ("tma", 128, 128, 64)
    assert S90.choose(P(), (64, 128), variant="tma") == ("tma", 64, 128, 64)
    # ... and Br = 192, Bc = 128 from WIDE_SEQLEN queries and keys, masked or not (the cp.async producer has no such
    # tile); fewer queries keep the shorter tiles
    for window in ((-1, 0), (10, -1), (-1, -1)):
        P.window = window
        for sq, sk, tile in ((S90.WIDE_SEQLEN, S90.WIDE_SEQLEN, (192, 128, 64)),
                             (S90.WIDE_SEQLEN - 1, S90.WIDE_SEQLEN, (64, 128, 64)),
                             (S90.WIDE_SEQLEN, S90.WIDE_SEQLEN - 1, (64, 128, 64)),
                             (S90.WIDE_SEQLEN - 1, 16384, (128, 128, 64)), (1, 16384, (128, 128, 64))):
            P.seqlen_q, P.seqlen_k = sq, sk
            assert S90.choose(P(), variant="tma") == ("tma",) + tile, (window, sq, sk)
            assert S90.choose(P(), variant="ws")[1:3] == (128, 128)
    assert S90.choose(P(), (192, 64), variant="tma") == ("tma", 192, 64, 64)
    # "auto": tmap, with the tiles tma would take at head_dim 64 and pv_n = 128 at head_dim 128 at every length (tma
    # pv_n = 64 beyond SHORT_SEQLEN_K keys); tma for a tile tmap does not instantiate
    for d, sq, sk in ((64, 300, 16384), (64, 4096, 4096), (64, 1023, 1024), (128, 2048, S90.SHORT_SEQLEN_K),
                      (128, 8192, 8192), (128, 100, S90.SHORT_SEQLEN_K + 1)):
        P.head_dim, P.seqlen_q, P.seqlen_k = d, sq, sk
        tma = S90.choose(P(), variant="tma")
        want = ("tmap",) + (tma[1:] if d == 64 else (128, 128, 128))
        assert S90.choose(P(), variant="auto") == want, (d, sq, sk)
        assert tma[3] == (128 if d == 128 and sk <= S90.SHORT_SEQLEN_K else 64)
    P.head_dim, P.seqlen_q, P.seqlen_k = 64, 4096, 4096
    assert S90.choose(P(), (192, 64), variant="auto") == ("tma", 192, 64, 64)
    P.window = (-1, 0)
    P.head_dim, P.seqlen_k = 128, 1024
    assert S90.choose(P(), (128, 128), 128, "simple") == ("simple", 128, 128, 128)
    for bad in (dict(variant="fa9"), dict(variant="AUTO"), dict(block_sizes=(64, 64), variant="simple"), dict(pv_n=128, variant="ws_nopp")):
        with pytest.raises(ValueError):
            S90.choose(P(), **bad)


@pytest.mark.skipif(os.environ.get("CUFLASH_SKIP_SLOW_COMPILE") == "1", reason="compile check disabled")
def test_default_instantiations_compile_to_hgmma_without_spills():
    """ptxas: no spills; the cubin holds the wgmma (PTX) of both GEMMs. (SASS HGMMA counts: the benchmark.)"""
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    from cuflash import _compile

    try:
        nvrtc.getVersion()
    except Exception:
        pytest.skip("libnvrtc not available")
    for var in S90.VARIANTS:
        d = 128
        br, bc, pv = S90.TILES[(var, d)][0]
        name = S90.kernel_name(BF16, d, var, br, bc, pv)
        rep = _compile.compile_offline(S90.SOURCE, name, arch="90a", extra_options=S90.compile_options(var))
        print(name, {k: rep[k] for k in ("registers", "stack", "spill_stores", "spill_loads")})
        assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0 and rep["stack"] == 0, name
        assert "C7508" not in rep["log"] and "C7510" not in rep["log"] and "C7512" not in rep["log"], rep["log"]


def test_gpu_reference_matches_cpu_reference(rng):
    cp = pytest.importorskip("cupy")
    if not _is_sm90():
        pytest.skip("GPU reference check runs with the GPU tests")
    q = rng.standard_normal((1, 2, 37, 16))
    k = rng.standard_normal((1, 1, 53, 16))
    v = rng.standard_normal((1, 1, 53, 16))
    for causal, window in MASKS.values():
        o, l = ref64(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal, None, window)
        ro, rl = reference.attention(q, k, v, causal=causal, window_size=window)
        np.testing.assert_allclose(cp.asnumpy(o), ro, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(cp.asnumpy(l)), np.isneginf(rl))


# ------------------------------------------------------------------------------------------------ GPU tests
VARS = list(S90.VARIANTS)
DEFAULTS = S90.default_variants()  # "auto": tmap, or tma for a tile only it has (both tested)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_persistent_blocks_take_several_tiles(cp, rng, head_dim, mask):
    """'tmap' with many more Q tiles than blocks (each block loops over several, the K/V ring and its mbarrier
    phases running on across them), and seqlen_q >> seqlen_k with a local window (Q tiles that see no key between
    ones that do): the reference check, and output and lse bitwise equal to 'tma' with the same tile."""
    causal, window = MASKS[mask]
    for (b, h, sq, sk) in ((4, 16, 2048, 2048), (2, 8, 3000, 400), (1, 4, 8192, 8192)):
        q = randn(cp, rng, (b, h, sq, head_dim), BF16)
        k = randn(cp, rng, (b, h, sk, head_dim), BF16)
        v = randn(cp, rng, (b, h, sk, head_dim), BF16)
        o1, l1 = check(q, k, v, causal, None, window, what=f"d{head_dim} {mask} {b}x{h}x{sq}x{sk}", variant="tmap")
        br, bc, pv = S90.default_tile("tmap", head_dim, sq, sk)  # the tile tmap ran, on the non-persistent grid
        o0, l0 = run(q, k, v, causal, None, window, variant="tma", block_sizes=(br, bc), pv_n=pv)
        assert bool(cp.array_equal(o0.view(cp.uint16), o1.view(cp.uint16))), f"tmap != tma {sq}x{sk}"
        assert bool(cp.array_equal(l0.view(cp.uint32), l1.view(cp.uint32))), f"tmap lse != tma {sq}x{sk}"


@pytest.mark.parametrize("group", [1, 3, 16])
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_persistent_longest_first_groups(cp, rng, monkeypatch, group):
    """The persistent variant's longest-first groups of heads (LPT_GROUP_BYTES sized for ``group`` heads; 2 x 8
    (batch, head) pairs, so groups of 3 leave a last group of 1) cover every work tile exactly once: causal and
    right-windowed, output and lse bitwise equal to 'tma' with the same tile."""
    d, sq, sk = 64, 1500, 1700
    monkeypatch.setattr(S90, "LPT_GROUP_BYTES", group * 2 * sk * d * 2)
    monkeypatch.setattr(S90, "LPT_MIN_SEQLEN", sq)
    q = randn(cp, rng, (2, 8, sq, d), BF16)
    k = randn(cp, rng, (2, 8, sk, d), BF16)
    v = randn(cp, rng, (2, 8, sk, d), BF16)
    for causal, window in ((True, (-1, -1)), (False, (300, 20))):
        assert S90.group_heads(prepare(q, k, v, causal=causal, window_size=window), d) == group
        o1, l1 = check(q, k, v, causal, None, window, what=f"groups of {group}", variant="tmap")
        br, bc, pv = S90.default_tile("tmap", d, sq, sk)
        o0, l0 = run(q, k, v, causal, None, window, variant="tma", block_sizes=(br, bc), pv_n=pv)
        assert bool(cp.array_equal(o0.view(cp.uint16), o1.view(cp.uint16))), f"tmap != tma, groups of {group}"
        assert bool(cp.array_equal(l0.view(cp.uint32), l1.view(cp.uint32))), f"tmap lse != tma, groups of {group}"


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_persistent_work_counter_per_stream_and_reset(cp, rng):
    """'tmap' blocks claim their work tiles from a counter (one pair per device and stream): launches on two
    streams, not synchronised with each other, each on fresh inputs (a tile claimed twice or skipped leaves another
    call's values or the poison), every output checked; both counters are back to zero afterwards (the last block
    out resets them), so the next launch starts at tile 0. The inputs are made on the stream that uses them (made
    on the legacy default stream, a non-blocking stream's kernel may read them before they are written: the
    470b892 run failed so, garbage in V giving outputs of 1e23)."""
    from cuflash import _compile

    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    calls = []
    for i in range(6):
        d, causal = (64, 128)[i % 2], bool(i // 2 % 2)
        with streams[i % 2]:
            q, k, v = (randn(cp, rng, (2, 4, 1500 + 97 * i, d), BF16) for _ in range(3))
            calls.append((q, k, v, causal, run(q, k, v, causal, variant="tmap")))
    for st in streams:
        st.synchronize()
    for q, k, v, causal, (o1, l1) in calls:  # each against 'tma' with the same tile, bitwise
        br, bc, pv = S90.default_tile("tmap", q.shape[-1], q.shape[-2], k.shape[-2])
        o0, l0 = run(q, k, v, causal, variant="tma", block_sizes=(br, bc), pv_n=pv)
        assert bool(cp.array_equal(o0.view(cp.uint16), o1.view(cp.uint16))), f"tmap != tma {q.shape} {causal}"
        assert bool(cp.array_equal(l0.view(cp.uint32), l1.view(cp.uint32))), f"tmap lse != tma {q.shape} {causal}"
    counters = [t for (dev, s_), t in _compile._COUNTERS.items() if s_ in (st.ptr for st in streams)]
    assert len(counters) == 2 and all(int(x) == 0 for t in counters for x in t.get())


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_tails_and_masks(cp, rng, variant, dtype, head_dim, mask, sq, sk):
    """attn-tails: irregular (seqlen_q, seqlen_k), causal / local / none, head_dim 64 and 128."""
    if variant not in DEFAULTS and dtype != BF16:
        pytest.skip("non-default variants: bfloat16 only here (test_every_configuration covers float16)")
    causal, window = MASKS[mask]
    b, h = (1, 2) if sq >= 2048 else (2, 3)
    q = randn(cp, rng, (b, h, sq, head_dim), dtype)
    k = randn(cp, rng, (b, h, sk, head_dim), dtype)
    v = randn(cp, rng, (b, h, sk, head_dim), dtype)
    check(q, k, v, causal, None, window, what=f"{dtype} d{head_dim} {mask} {sq}x{sk}", variant=variant)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_pin_softmax_changes_only_the_order(cp, rng, monkeypatch, dtype, head_dim, mask):
    """PIN_SOFTMAX (the default: the softmax kept between the two wgmma waits) reorders instructions only: the output
    and lse bits equal the default kernel's, at tails and with the default tiles of head_dim 64 (seqlen_k up to
    SHORT_SEQLEN_K and past it, and the wide tile from WIDE_SEQLEN); and the reference check passes."""
    causal, window = MASKS[mask]
    for sq, sk in ((113, 203), (1023, 1024), (300, S90.SHORT_SEQLEN_K + 77), (S90.WIDE_SEQLEN + 5, S90.WIDE_SEQLEN + 77)):
        q = randn(cp, rng, (1, 3, sq, head_dim), dtype)
        k = randn(cp, rng, (1, 3, sk, head_dim), dtype)
        v = randn(cp, rng, (1, 3, sk, head_dim), dtype)
        monkeypatch.setattr(S90, "PIN_SOFTMAX", False)
        o0, l0 = run(q, k, v, causal, None, window)
        monkeypatch.setattr(S90, "PIN_SOFTMAX", True)
        o1, l1 = check(q, k, v, causal, None, window, what=f"pin {dtype} d{head_dim} {mask} {sq}x{sk}")
        assert bool(cp.array_equal(o0.view(cp.uint16), o1.view(cp.uint16))), f"pin changed the output {sq}x{sk}"
        assert bool(cp.array_equal(l0.view(cp.uint32), l1.view(cp.uint32))), f"pin changed lse {sq}x{sk}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_default_wide_tile(cp, rng, dtype):
    """End to end through the default choice: head_dim 64 with WIDE_SEQLEN queries and keys and more (tail tiles on
    both) takes the Br = 192, Bc = 128 tile, causal or not, and matches the float64 reference; one query fewer
    takes a shorter tile."""
    if S90.DEFAULT_VARIANT not in ("auto", "tma", "tmap"):
        pytest.skip(f"the default variant is {S90.DEFAULT_VARIANT} ($CUFLASH_SM90_VARIANT)")
    for sq, sk, tile in ((S90.WIDE_SEQLEN + 37, S90.WIDE_SEQLEN + 101, (192, 128, 64)),
                         (S90.WIDE_SEQLEN - 1, S90.WIDE_SEQLEN + 101, (64, 128, 64))):
        q = randn(cp, rng, (1, 2, sq, 64), dtype)
        k = randn(cp, rng, (1, 2, sk, 64), dtype)
        v = randn(cp, rng, (1, 2, sk, 64), dtype)
        for causal in (False, True):
            assert S90.choose(prepare(q, k, v, causal=causal))[1:] == tile
            check(q, k, v, causal, what=f"default tile {dtype} causal={causal} {sq}x{sk}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("sq,sk", SHAPES)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_tails_and_masks_every_default_variant_tile(cp, rng, dtype, mask, sq, sk):
    """Every tile of the default variant on every tail shape and mask: at head_dim 64 Br = 128 with two consumer
    warpgroups, Br = 64 with one and two blocks per SM, Br = 192 (Bc = 64 and 128) with three; at head_dim 128
    Br = 128, Bc = 128 with pv_n 64 and 128."""
    for (dt, d, var, br, bc, pv) in S90.configurations():
        if dt != dtype or var not in DEFAULTS:
            continue
        causal, window = MASKS[mask]
        q = randn(cp, rng, (2, 3, sq, d), dtype)
        k = randn(cp, rng, (2, 3, sk, d), dtype)
        v = randn(cp, rng, (2, 3, sk, d), dtype)
        check(q, k, v, causal, None, window, what=f"Br{br} Bc{bc} {dtype} d{d} {mask} {sq}x{sk}", variant=var,
              block_sizes=(br, bc), pv_n=pv)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(6, 2), (4, 1)])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_gqa(cp, rng, variant, dtype, head_dim, hq, hkv, mask):
    causal, window = MASKS[mask]
    q = randn(cp, rng, (2, hq, 301, head_dim), dtype)
    k = randn(cp, rng, (2, hkv, 517, head_dim), dtype)
    v = randn(cp, rng, (2, hkv, 517, head_dim), dtype)
    check(q, k, v, causal, None, window, what=f"gqa {hq}/{hkv} {dtype} d{head_dim} {mask}", variant=variant)


@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_every_configuration(cp, rng, mask):
    """Every instantiated (variant, Br, Bc, pv_n), both dtypes, on a tail shape."""
    causal, window = MASKS[mask]
    for (dt, d, var, br, bc, pv) in S90.configurations():
        q = randn(cp, rng, (1, 2, 333, d), dt)
        k = randn(cp, rng, (1, 2, 401, d), dt)
        v = randn(cp, rng, (1, 2, 401, d), dt)
        check(q, k, v, causal, None, window, what=f"{dt} d{d} Br{br} Bc{bc} pv{pv} {mask}", variant=var,
              block_sizes=(br, bc), pv_n=pv)


@pytest.mark.parametrize("head_dim", [16, 32, 80, 96])
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_padded_head_dims(cp, rng, variant, head_dim):
    q = randn(cp, rng, (1, 2, 200, head_dim), BF16)
    k = randn(cp, rng, (1, 2, 250, head_dim), BF16)
    v = randn(cp, rng, (1, 2, 250, head_dim), BF16)
    check(q, k, v, True, None, (-1, -1), what=f"padded d{head_dim}", variant=variant)


@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_strided_bshd_view_and_scale(cp, rng, variant):
    x = randn(cp, rng, (2, 300, 4, 128), F16)       # (batch, seqlen, heads, head_dim)
    kv = randn(cp, rng, (2, 280, 2, 2, 128), F16)   # packed k, v
    q = x.transpose(0, 2, 1, 3)
    k = kv[:, :, 0].transpose(0, 2, 1, 3)
    v = kv[:, :, 1].transpose(0, 2, 1, 3)
    check(q, k, v, True, 0.3, (-1, -1), what="strided view, scale 0.3", variant=variant)


@pytest.mark.parametrize("scale", [-0.2, 0.0, 1e-3, 2.5])
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_softmax_scale_values(cp, rng, variant, scale):
    """The kernels fold a positive scale into the exponent; negative and zero scales go through the wrapper."""
    q = randn(cp, rng, (1, 2, 190, 64), BF16)
    k = randn(cp, rng, (1, 2, 210, 64), BF16)
    v = randn(cp, rng, (1, 2, 210, 64), BF16)
    check(q, k, v, True, scale, (-1, -1), what=f"scale {scale}", variant=variant)


# ---- handed cases (shared/cases/attention.json) ----
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_case_causal_sq_gt_sk(cp, rng, variant, dtype):
    """attn-causal-sq-gt-sk: rows 0..2 see no key -> exactly 0 and lse -inf; rows 3, 4 match."""
    q = randn(cp, rng, (1, 1, 5, 64), dtype)
    k = randn(cp, rng, (1, 1, 2, 64), dtype)
    v = randn(cp, rng, (1, 1, 2, 64), dtype)
    out, lse = check(q, k, v, True, what=f"case sq>sk {dtype}", variant=variant)
    assert bool(cp.all(out[0, 0, :3] == 0))
    assert bool(cp.all(cp.isneginf(lse[0, 0, :3]))) and bool(cp.all(cp.isfinite(lse[0, 0, 3:])))


@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_case_causal_sq_lt_sk(cp, rng, variant):
    """attn-causal-sq-lt-sk: query 0 sees keys 0..3, query 1 keys 0..4 (bottom-right)."""
    q = randn(cp, rng, (1, 2, 2, 64), BF16)
    k = randn(cp, rng, (1, 2, 5, 64), BF16)
    v = randn(cp, rng, (1, 2, 5, 64), BF16)
    out, _ = check(q, k, v, True, what="case sq<sk", variant=variant)
    # row 0 must not depend on key 4: change it, row 0 stays bitwise, row 1 changes
    k2 = k.copy()
    k2[:, :, 4] = randn(cp, rng, (1, 2, 64), BF16, 3.0)
    out2, _ = run(q, k2, v, True, variant=variant)
    assert bool(cp.all(out2[:, :, 0] == out[:, :, 0])) and not bool(cp.all(out2[:, :, 1] == out[:, :, 1]))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_case_large_logits(cp, rng, variant, head_dim):
    """attn-large-logits: q, k ~ N(0, 40^2): scores in the thousands, finite output."""
    q = randn(cp, rng, (1, 1, 256, head_dim), BF16, 40.0)
    k = randn(cp, rng, (1, 1, 256, head_dim), BF16, 40.0)
    v = randn(cp, rng, (1, 1, 256, head_dim), BF16)
    out, lse = check(q, k, v, False, what=f"case large logits d{head_dim}", variant=variant)
    assert bool(cp.isfinite(out.astype(cp.float32)).all()) and bool(cp.isfinite(lse).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_case_deterministic(cp, rng, variant, dtype):
    """attn-deterministic-forward: (2, 8, 1000, 128), out and lse bitwise identical over 20 calls."""
    q = randn(cp, rng, (2, 8, 1000, 128), dtype)
    k = randn(cp, rng, (2, 8, 1000, 128), dtype)
    v = randn(cp, rng, (2, 8, 1000, 128), dtype)
    for causal in (False, True):
        o0, l0 = run(q, k, v, causal, variant=variant)
        for _ in range(19):
            o, l = run(q, k, v, causal, variant=variant)
            assert bool(cp.all(o.view(cp.uint16) == o0.view(cp.uint16))), "output changed between calls"
            assert bool(cp.all(l.view(cp.uint32) == l0.view(cp.uint32))), "lse changed between calls"
    check(q, k, v, True, what=f"case deterministic {dtype}", variant=variant)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_extreme_inputs(cp, rng, variant, dtype):
    shape = (1, 2, 150, 64)
    # huge +/- values in q (scores far beyond exp's range before the max is subtracted)
    q = randn(cp, rng, shape, dtype, 100.0)
    k = randn(cp, rng, shape, dtype, 1.0)
    v = randn(cp, rng, shape, dtype)
    check(q, k, v, False, what=f"extreme huge q {dtype}", variant=variant)
    # all-equal scores: causal rows average their visible v rows; non-causal rows all equal the mean of v
    qe = cp.full(shape, 0.5, dtype=dtype)
    ke = cp.full(shape, -0.25, dtype=dtype)
    check(qe, ke, v, True, what=f"extreme all-equal {dtype}", variant=variant)
    out, _ = run(qe, ke, v, False, variant=variant)
    mean = v.astype(cp.float64).mean(axis=2, keepdims=True)
    assert float(cp.abs(out.astype(cp.float64) - mean).max()) < 2e-2
    # NaN in one key of head 0: that head's rows turn NaN (propagated, not hidden); head 1 is unaffected
    kn = k.copy()
    kn[0, 0, 3, 0] = cp.nan
    o_nan, _ = run(q, kn, v, False, variant=variant)
    assert bool(cp.isnan(o_nan[0, 0].astype(cp.float32)).any())
    assert not bool(cp.isnan(o_nan[0, 1].astype(cp.float32)).any())


@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_one_element_fully_masked_and_empty(cp, rng, variant):
    q = randn(cp, rng, (1, 1, 1, 64), F16)
    k = randn(cp, rng, (1, 1, 1, 64), F16)
    v = randn(cp, rng, (1, 1, 1, 64), F16)
    check(q, k, v, True, what="one element", variant=variant)
    # window (0, 0) with seqlen_q > seqlen_k: the first 570 rows see nothing (whole Q tiles without a K tile)
    q = randn(cp, rng, (1, 2, 700, 128), BF16)
    k = randn(cp, rng, (1, 2, 130, 128), BF16)
    v = randn(cp, rng, (1, 2, 130, 128), BF16)
    out, lse = check(q, k, v, False, None, (0, 0), what="window (0,0) sq>sk", variant=variant)
    assert bool(cp.all(out[:, :, :570] == 0)) and bool(cp.all(cp.isneginf(lse[:, :, :570])))
    # empty key set: every row 0, lse -inf
    ke = cp.empty((1, 2, 0, 128), dtype=BF16)
    out, lse = run(q, ke, ke, False, variant=variant)
    assert bool(cp.all(out == 0)) and bool(cp.all(cp.isneginf(lse)))


@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_variants_agree_with_fa2_forward(cp, rng, variant):
    """Same problem through the FA-2 forward (mma.sync): close to each other."""
    from cuflash.attention import attention

    q = randn(cp, rng, (2, 4, 777, 128), BF16)
    k = randn(cp, rng, (2, 2, 901, 128), BF16)
    v = randn(cp, rng, (2, 2, 901, 128), BF16)
    o90, l90 = run(q, k, v, True, variant=variant)
    o80, l80 = attention(q, k, v, causal=True, return_lse=True, schedule="fa2")
    d = float(cp.abs(o90.astype(cp.float32) - o80.astype(cp.float32)).max())
    dl = float(cp.abs(l90 - l80).max())
    print(f"[{variant}] vs fa2: out max diff {d:.3e}, lse max diff {dl:.3e}")
    assert d < 2e-2 and dl < 1e-3


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("variant", VARS)
@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_diagnose_operand_paths(cp, rng, variant, head_dim):
    """Separates the two GEMM paths, so a layout error says which one it is.

    (a) V path alone: q = 0 -> every score 0 -> P uniform -> each output row is the column mean of V
        (exercises the V descriptor / MN-major transpose and the P register operand with constant P).
    (b) S path: V = a permutation matrix (head_dim keys) -> out = P permuted -> compares the probabilities
        (exercises the Q and K descriptors, the accumulator layout, and P as the A operand).
    """
    d = head_dim
    k = randn(cp, rng, (1, 1, 200, d), BF16)
    v = randn(cp, rng, (1, 1, 200, d), BF16)
    q0 = cp.zeros((1, 1, 130, d), dtype=BF16)
    out, _ = run(q0, k, v, False, variant=variant)
    mean = v.astype(cp.float64).mean(axis=2, keepdims=True)
    e_v = float(cp.abs(out.astype(cp.float64) - mean).max())
    perm = rng.permutation(d)
    vp = cp.zeros((1, 1, d, d), dtype=np.float32)
    vp[0, 0, cp.arange(d), cp.asarray(perm)] = 1.0
    vp = vp.astype(BF16)
    q = randn(cp, rng, (1, 1, 130, d), BF16)
    kp = randn(cp, rng, (1, 1, d, d), BF16)
    out2, _ = run(q, kp, vp, False, variant=variant)
    ro, _ = ref64(q, kp, vp)
    e_s = float(cp.abs(out2.astype(cp.float64) - ro).max())
    print(f"[{variant}] d{d}: V-path error {e_v:.3e} (q = 0), S-path error {e_s:.3e} (V = permutation)")
    assert e_v < 1e-2, f"V path (MN-major V descriptor / P operand) wrong: {e_v:.3e}"
    assert e_s < 1e-2, f"S path (Q/K descriptors, accumulator layout) wrong: {e_s:.3e}"


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs a compute capability 9.0 GPU")
def test_tma_fallback_for_broadcast_kv(cp, rng):
    """K/V broadcast over the batch (stride 0) cannot be a tensor map: the default falls back to the cp.async
    producer with the same result; asking for the TMA variant by name raises a ValueError before any launch."""
    q = randn(cp, rng, (3, 2, 150, 128), BF16)
    k1, v1 = randn(cp, rng, (1, 2, 170, 128), BF16), randn(cp, rng, (1, 2, 170, 128), BF16)
    k, v = cp.broadcast_to(k1, (3, 2, 170, 128)), cp.broadcast_to(v1, (3, 2, 170, 128))
    assert S90.tensor_map(k, 128) is None and S90.tensor_map(cp.ascontiguousarray(k), 128) is not None
    p = prepare(q, k, v, causal=True)
    out, lse = S90.forward(p)
    ro, rl = ref64(q, k, v, True, None, (-1, -1))
    bo = baseline(q, k, v, True, None, (-1, -1))
    err, berr = float(cp.abs(out.astype(cp.float64) - ro).max()), float(cp.abs(bo.astype(cp.float64) - ro).max())
    assert err <= 2 * berr + 1e-5, (err, berr)
    with pytest.raises(ValueError, match="tma"):
        S90.forward(p, variant="tma")
    # a tile only the TMA producer instantiates (Br = 192 at head_dim 64) cannot fall back: ValueError, no launch
    k64 = cp.broadcast_to(randn(cp, rng, (1, 2, 170, 64), BF16), (3, 2, 170, 64))
    p64 = prepare(randn(cp, rng, (3, 2, 150, 64), BF16), k64, k64, causal=True)
    with pytest.raises(ValueError, match="Br=192"):
        S90.forward(p64, block_sizes=(192, 64))
