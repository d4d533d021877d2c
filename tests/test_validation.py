"""Argument checks that must raise before any launch (CPU tests on array headers over untouched memory), and the
GPU tests of the inputs they now accept: every public function rejects what its reference library rejects
(scipy.special, torch.nn.functional, FlashAttention) with the documented TypeError / ValueError."""
import numpy as np
import pytest

import cuflash
from attn_helpers import device_free_array as free
from cuflash import _attn_common, _compile, _dtypes, reference

BF16 = _dtypes.bfloat16


def qkv(shape=(2, 4, 128, 64), dtype=BF16):
    return free(shape, dtype), free(shape, dtype), free(shape, dtype)


def test_as_float():
    for v, f in ((2, 2.0), (0.5, 0.5), (np.float16(0.25), 0.25), (np.int64(3), 3.0)):
        assert _attn_common.as_float(v, "s") == f
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert _attn_common.as_float(ml_dtypes.bfloat16(0.5), "s") == 0.5
    for v in ("0.5", b"1", True, np.bool_(False), 1j, None, [1.0]):
        with pytest.raises(TypeError, match="real number"):
            _attn_common.as_float(v, "s")
    for v in (float("nan"), float("inf"), 1e39, -1e39, 2.0**128 - 2.0**103, -(2.0**128 - 2.0**103)):
        with pytest.raises(ValueError, match="finite in float32"):  # (the last two round to inf in float32)
            _attn_common.as_float(v, "s")
    top = np.nextafter(2.0**128 - 2.0**103, 0)  # the largest double that rounds to float32's max, not to inf
    assert np.isfinite(np.float32(top)) and _attn_common.as_float(top, "s") == top


@pytest.mark.parametrize("scale, err", [("0.5", TypeError), (True, TypeError), (1e39, ValueError),
                                        (float("nan"), ValueError)])
def test_attention_scale_checked_as_the_kernel_sees_it(scale, err):
    q, k, v = qkv()
    with pytest.raises(err, match="softmax_scale"):
        cuflash.attention(q, k, v, softmax_scale=scale)
    with pytest.raises(err, match="softmax_scale"):
        cuflash.attention_backward(q, q, k, v, q, free((2, 4, 128)), softmax_scale=scale)


def test_attention_flags_sizes_and_windows():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="return_lse"):
        cuflash.attention(q, k, v, return_lse="no")
    with pytest.raises(TypeError, match="deterministic"):
        cuflash.attention_backward(q, q, k, v, q, free((2, 4, 128)), deterministic="no")
    for w in ({4: 0, 1: 1}, {1, 2}):
        with pytest.raises(TypeError, match="window_size"):
            cuflash.attention(q, k, v, window_size=w)
    kk = free((1, 1, 2**31, 64), BF16, strides=(0, 0, 0, 2))  # a legal broadcast: 2^31 keys
    with pytest.raises(ValueError, match="2\\^31"):
        cuflash.attention(free((1, 1, 128, 64), BF16), kk, kk)


def test_backward_block_sizes_checked_for_float32_too():
    q, k, v = qkv(dtype=np.float32)
    with pytest.raises(ValueError, match="not instantiated"):  # head_dim 64 has Bc 64 and 128, not Br 128
        cuflash.attention_backward(q, q, k, v, q, free((2, 4, 128)), block_sizes=(128, 64))


def test_launch_refuses_grids_beyond_cuda_limits():
    calls = []

    class Kernel:
        name = "k"

        def __call__(self, *a, **kw):
            calls.append(a)

    for grid in ((1, 65536, 1), (1, 1, 70000), (2**31, 1, 1), (2**31,)):
        with pytest.raises(ValueError, match="exceeds CUDA's limit on grid"):
            _compile.launch(Kernel(), grid, (128,), ())
    assert not calls
    _compile.launch(Kernel(), (2**31 - 1, 65535, 65535), (128,), ())
    assert len(calls) == 1
    # the launch's name: a string or a callable, formatted only for the error (never on a launch that goes)
    with pytest.raises(ValueError, match=r"^layer_norm hidden=7: grid"):
        _compile.launch(Kernel(), (2**31,), (128,), (), what=lambda: "layer_norm hidden=7")
    with pytest.raises(ValueError, match=r"^named: grid"):
        _compile.launch(Kernel(), (2**31,), (128,), (), what="named")
    _compile.launch(Kernel(), (1,), (128,), (), what=lambda: 1 / 0)
    assert len(calls) == 2


@pytest.mark.parametrize("shape", ["64", (4.7,), ("4",), True, (np.float64(4.0),), None])
def test_norm_shape_must_be_ints(shape):
    x = free((8, 6, 4))
    with pytest.raises(TypeError, match="normalized_shape"):
        cuflash.layer_norm(x, shape)


def test_norm_errors_name_the_function_and_return_stats_is_a_bool():
    x = free((8, 4))
    for fn, name in ((cuflash.layer_norm, "layer_norm"), (cuflash.rms_norm, "rms_norm")):
        with pytest.raises(TypeError, match=f"{name}: normalized_shape"):
            fn(x, "4")
        with pytest.raises(TypeError, match=f"{name}: normalized_shape entry"):
            fn(x, (4.0,))
        for bad in ("no", None, 2, 0.0):
            with pytest.raises(TypeError, match=f"{name}: return_stats"):
                fn(x, 4, return_stats=bad)


def test_block_sizes_errors_name_the_padded_head_dim_and_fa1_checks_before_the_device():
    q, k, v = qkv((1, 2, 64, 40))
    with pytest.raises(ValueError, match=r"head_dim 40 \(padded to 64\)"):
        cuflash.attention(q, k, v, schedule="fa2", block_sizes=(100, 64))
    with pytest.raises(ValueError, match=r"head_dim 40 \(padded to 64\)"):
        cuflash.attention_backward(q, q, k, v, q, free((1, 2, 64)), block_sizes=(64, 32))
    with pytest.raises(ValueError, match="fa1 block_sizes"):  # before the shared-memory query (no GPU here)
        cuflash.attention(q, k, v, schedule="fa1", block_sizes=(100, 64))


@pytest.mark.parametrize("eps, err", [("1e-5", TypeError), (True, TypeError), ([1e-5], TypeError),
                                      (1e39, ValueError), (-1e-5, ValueError), (float("nan"), ValueError)])
def test_norm_eps_checked_as_the_kernel_sees_it(eps, err):
    x = free((8, 4))
    with pytest.raises(err, match="eps"):
        cuflash.layer_norm(x, 4, None, None, eps)
    with pytest.raises(err, match="eps"):
        cuflash.rms_norm(x, 4, None, eps)


def test_softmax_axis_forms_as_scipy():
    x = free((4, 6))
    for f in (cuflash.softmax, cuflash.log_softmax, cuflash.logsumexp, cuflash.online_softmax_state):
        with pytest.raises(TypeError, match="axis"):  # scipy: 'list' object cannot be interpreted as an integer
            f(x, axis=[0])
    with pytest.raises(ValueError):  # a 0-d array takes the int axis 0 / -1 (numpy's reductions), not (0,)
        cuflash.softmax(free(()), axis=(0,))


def test_states_are_pairs():
    m = free((3,))
    for bad in ({1: 2, 3: 4}, frozenset({1, 2}), "ml"):
        with pytest.raises(TypeError, match="pair"):
            cuflash.merge_states(bad, (m, m))
        with pytest.raises(TypeError, match="pair"):
            cuflash.lse_from_state(bad)


# ------------------------------------------------------------------------------------------------ GPU tests
@pytest.mark.gpu
def test_accepted_inputs_on_the_gpu(cp):
    import scipy.special

    ml_dtypes = pytest.importorskip("ml_dtypes")
    x0 = cp.asarray(np.float32(1.5))
    for ax in (0, -1):  # scipy: softmax 1.0, log_softmax 0.0 on a 0-d array with axis 0 / -1
        assert float(cuflash.softmax(x0, axis=ax)) == scipy.special.softmax(np.float32(1.5), axis=ax) == 1.0
        assert float(cuflash.log_softmax(x0, axis=ax)) == 0.0
    # Python numbers are weak next to float64 states: 1e300 stays finite
    m64, l64 = cp.full((4,), -np.inf), cp.zeros((4,))
    m, l = cuflash.merge_states((1e300, 0.1), (m64, l64))
    assert m.dtype == np.float64 and float(m[0]) == 1e300 and float(l[0]) == 0.1
    assert float(cuflash.lse_from_state((0.0, 1e-50 * cp.ones((), np.float64)))) == pytest.approx(np.log(1e-50))
    # a bfloat16 scalar weight, as scipy takes any real scalar
    a = cp.asarray(np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4))
    got = cuflash.logsumexp(a, axis=-1, b=ml_dtypes.bfloat16(2))
    want = scipy.special.logsumexp(cp.asnumpy(a), axis=-1, b=2.0)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-6)
    # misaligned float32 views of a byte buffer (known values placed at the byte offsets): copied, not
    # floor-divided (byte strides that are not whole elements) and not loaded misaligned (a shifted start)
    rng = np.random.default_rng()

    def placed(rows, cols, offset, row_bytes):
        vals = rng.standard_normal((rows, cols)).astype(np.float32) * 3
        buf = rng.integers(0, 256, offset + rows * row_bytes + 16, dtype=np.uint8)
        for r in range(rows):
            buf[offset + r * row_bytes: offset + r * row_bytes + 4 * cols] = vals[r].view(np.uint8)
        dev = cp.asarray(buf)
        return cp.ndarray((rows, cols), np.float32, memptr=dev.data + offset, strides=(row_bytes, 4)), vals

    view, vals = placed(4, 64, 0, 322)  # rows 322 bytes apart
    np.testing.assert_allclose(cp.asnumpy(cuflash.logsumexp(view, axis=-1)),
                               scipy.special.logsumexp(vals.astype(np.float64), axis=-1), rtol=1e-5)
    shifted, vals = placed(3, 64, 2, 320)  # whole-element strides, start 2 bytes past an element boundary
    np.testing.assert_allclose(cp.asnumpy(cuflash.softmax(shifted, axis=-1)),
                               scipy.special.softmax(vals.astype(np.float64), axis=-1), rtol=1e-5, atol=1e-7)
    xn, vals = placed(2, 32, 6, 322)
    np.testing.assert_allclose(cp.asnumpy(cuflash.layer_norm(xn, (32,))), reference.layer_norm(vals, (32,))[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 65536, 1, 64), (65536, 1, 1, 64)], ids=["heads", "batch"])
def test_attention_grid_limits_before_any_device_query(shape, monkeypatch):
    """More than 65535 query heads or batches (the kernels' grid.y / grid.z): ValueError from the argument checks,
    before the device is asked anything or an output allocated (on this machine a device query would fail)."""
    import cupy

    def no_device(*a, **kw):
        raise AssertionError("device queried before the argument checks")

    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", no_device)
    monkeypatch.setattr(_compile, "compute_capability", no_device)
    monkeypatch.setattr(_compile, "sm_count", no_device)
    q = free(shape, BF16)
    for schedule in ("auto", "fa2", "wgmma"):
        with pytest.raises(ValueError, match="65535"):
            cuflash.attention(q, q, q, schedule=schedule)
    with pytest.raises(ValueError, match="65535"):
        cuflash.attention_backward(q, q, q, q, q, free(shape[:3], np.float32))


@pytest.mark.parametrize("fn", [cuflash.softmax, cuflash.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_empty_reduction_before_any_device_query(fn, monkeypatch):
    """softmax / log_softmax over an empty axis: scipy's ValueError from the argument checks, before any device
    query (logsumexp and the state are defined there: -inf, (-inf, 0))."""
    import cupy

    def no_device(*a, **kw):
        raise AssertionError("device queried before the argument checks")

    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", no_device)
    for shape, axis in (((4, 0), -1), ((0, 3), 0), ((2, 0, 3), (1, 2)), ((0,), None)):
        with pytest.raises(ValueError, match="zero-size array"):
            fn(free(shape, np.float32), axis=axis)
