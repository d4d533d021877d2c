"""cuflash softmax / log_softmax / logsumexp / online-softmax state against float64 scipy.special.

Every kernel path (warp, block, split, cluster, stream) at the row lengths around each switch and each vector tail, the
three 16/32-bit dtypes (and float64), many rows, non-contiguous inputs and several axes; the handed cases of
``shared/cases/softmax.json`` one by one; property tests of the state merge and of row sums; bad input.
The rule (every kernel test of cuflash): the error is within 2x the error of a straightforward implementation in the same precision
(scipy on float32 data, rounded once to the output dtype) plus a per-dtype floor; non-finite values must match.
"""
import importlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.special

from attn_helpers import device_free_array as _device_free_array
from cuflash import _dtypes

sm = importlib.import_module("cuflash.softmax")  # the module (cuflash.softmax is the function)

gpu = pytest.mark.gpu
DTYPES = {"float32": _dtypes.float32, "float16": _dtypes.float16, "bfloat16": _dtypes.bfloat16}
ALL_DTYPES = dict(DTYPES, float64=_dtypes.float64)
CASES = Path(__file__).resolve().parent / "cases" / "softmax.json"  # a copy of shared/cases/softmax.json
SMS = 132  # the H200's SM count: plan() arithmetic below uses it; GPU tests read the device's


# ----------------------------------------------------------------------------------------------------------
# helpers
def _to_device(x_f64, dtype):
    import cupy

    return cupy.asarray(np.asarray(x_f64).astype(dtype))


def _check(out, ref, base, dtype, n, what=""):
    """out (kernel), ref (float64), base (same-precision baseline) as NumPy float64 arrays.

    Elementwise |out - ref| <= 2·max|base - ref| + atol + rtol·s, with s = |ref| for softmax (values in [0, 1])
    and s = max(|ref|, 1) for the log outputs (their errors are absolute: x − m − log l)."""
    out, ref, base = (np.asarray(a, dtype=np.float64) for a in (out, ref, base))
    assert out.shape == ref.shape, (out.shape, ref.shape)
    with np.errstate(over="ignore"):  # what the output dtype can hold (-1.2e5 is -inf in float16)
        ref = ref.astype(dtype).astype(np.float64)
    nan_ok = np.array_equal(np.isnan(out), np.isnan(ref))
    inf_ok = np.array_equal(np.where(np.isinf(ref), ref, 0), np.where(np.isinf(out), out, 0))
    fin = np.isfinite(ref) & np.isfinite(out)
    err = np.abs(out - ref)[fin]
    berr = np.abs(base - ref)[fin]
    atol, rtol = _dtypes.tolerance(dtype, n)
    scale = np.abs(ref[fin]) if what.startswith("softmax") else np.maximum(np.abs(ref[fin]), 1.0)
    allowed = 2 * berr.max(initial=0.0) + atol + rtol * scale
    worst = float((err - allowed).max(initial=-1.0))
    print(f"{what} {np.dtype(dtype)} n={n}: kernel max|err| {err.max(initial=0):.3g} "
          f"mean {err.mean() if err.size else 0:.3g}; baseline max|err| {berr.max(initial=0):.3g}; "
          f"nan/inf pattern ok {nan_ok}/{inf_ok}")
    assert nan_ok and inf_ok, f"{what}: non-finite pattern differs from scipy"
    assert worst <= 0, f"{what}: error exceeds 2x baseline + floor by {worst:.3g}"


def _baseline(fn, x64, dtype, **kw):
    """The straightforward same-precision implementation: scipy on float32 data, rounded once to dtype."""
    with np.errstate(all="ignore"):
        acc = np.float64 if np.dtype(dtype) == _dtypes.float64 else np.float32
        r = fn(np.asarray(x64).astype(dtype).astype(acc), **kw)
    return np.asarray(r).astype(dtype).astype(np.float64)


def _ref(fn, x64, dtype, **kw):
    with np.errstate(all="ignore"):
        return np.asarray(fn(np.asarray(x64).astype(dtype).astype(np.float64), **kw))


def _compare_all(x64, dtype, axis=-1, ops=("softmax", "log_softmax", "logsumexp"), x_dev=None, **kw):
    import cuflash

    xd = _to_device(x64, dtype) if x_dev is None else x_dev
    n = x64.size if axis is None else math.prod(np.asarray(x64).shape[a] for a in np.atleast_1d(axis))
    for op in ops:
        out = getattr(cuflash, op)(xd, axis=axis, **kw)
        assert out.dtype == np.dtype(dtype), (op, out.dtype)
        f = getattr(scipy.special, op)
        _check(out.get(), _ref(f, x64, dtype, axis=axis), _baseline(f, x64, dtype, axis=axis), dtype, n, op)
        if op == "softmax":  # rows sum to 1 (where scipy's row is finite)
            s = np.asarray(out.get(), dtype=np.float64).sum(axis=axis)
            fin = np.isfinite(_ref(f, x64, dtype, axis=axis)).all(axis=axis)
            atol, rtol = _dtypes.tolerance(dtype, n)
            err = np.abs(s - 1)[fin]
            assert np.all(err <= 2 * _dtypes.eps(dtype) + rtol), f"row sums off by {err.max()}"


def _switch_lengths(dtype):
    """Row lengths around every path switch of plan() (aligned and odd) and the vector-width tails."""
    vec, nv = 16 // np.dtype(dtype).itemsize, sm._nv(dtype)
    edges = [g * nv * vec for g in sm.WARP_GROUPS] + [t * nv * vec for t in sm.BLOCK_THREADS]
    edges.append(sm.SPLIT_MAX_THREADS * nv * vec * 2)  # two split chunks
    out = {1, 2, 3, vec - 1, vec, vec + 1, 2 * vec + 1}
    for e in edges:
        out |= {e - vec, e - 1, e, e + 1, e + vec}
    return sorted(x for x in out if x >= 1)


CASE_LENGTHS = [1, 2, 31, 32, 33, 127, 1023, 1024, 1025, 2047, 2048, 2049, 4097, 24575, 24576, 65536, 65537,
                262144, 1048577]


# ----------------------------------------------------------------------------------------------------------
# CPU: planning arithmetic, the handed cases are all covered, reference state semantics
COVERED_CASES = {"sm-all-neg-inf-row", "sm-pos-inf", "sm-neg-inf-entry", "sm-empty", "sm-transposed-axis",
                 "sm-row-lengths-around-paths", "sm-many-rows", "sm-merge-empty-states"}


def test_every_handed_case_has_a_test():
    if not CASES.is_file():
        pytest.skip(f"{CASES} not present (the handed cases live beside the checkout)")
    ids = {c["id"] for c in json.loads(CASES.read_text())}
    assert ids <= COVERED_CASES, f"cases without a test: {sorted(ids - COVERED_CASES)}"


@pytest.mark.parametrize("dtype", list(ALL_DTYPES.values()), ids=list(ALL_DTYPES))
def test_plan_paths_and_capacity(dtype):
    vec, nv = 16 // np.dtype(dtype).itemsize, sm._nv(dtype)
    seen = set()
    for n in _switch_lengths(dtype) + CASE_LENGTHS:
        for rows in (3, 4 * SMS):
            for aligned in (True, False):
                p = sm.plan(dtype, rows, n, aligned=aligned, sms=SMS)
                seen.add(p.path)
                slots = -(-(n + (0 if aligned else vec - 1)) // vec)
                if p.path in ("warp", "block"):  # (the widest block holds 16 slots a thread)
                    assert p.group * nv * (2 if p.group == sm.BLOCK_THREADS[-1] else 1) >= slots and p.chunks == 1
                else:
                    assert p.chunks * p.slots_per_chunk >= slots
    f64 = np.dtype(dtype) == np.float64
    assert seen == ({"warp", "block", "stream"} if f64 else {"warp", "block", "split"})
    # fewer rows than SMs split medium rows (float64: two launches); the pipelined split has no length limit
    assert sm.plan(dtype, 8, 8192, sms=SMS).path == ("stream" if f64 else "split")
    assert sm.plan(dtype, 1, 1 << 30, sms=SMS).path == ("stream" if f64 else "split")
    # the register-held split (study) is bounded by the blocks that fit on the GPU at once
    regs = {"split": "registers"}
    p = sm.plan(dtype, 1, 1 << 16, sms=SMS, partition=regs, residency=lambda t: 2 * SMS)
    assert p.path == "split_regs" and p.threads * nv >= p.slots_per_chunk
    assert sm.plan(dtype, 1, 1 << 26, sms=SMS, partition=regs, residency=lambda t: 2 * SMS).path == "stream"
    assert sm.plan(dtype, 8, 8192, method="safe", sms=SMS).path == "stream"
    assert sm.plan(dtype, 8, 8192, partition={"single_read": False}, sms=SMS).path == "stream"
    assert sm.plan(dtype, 4096, 8192, op=sm.OP_LSE, sms=SMS).path in ("block", "stream")


def test_reference_merge_of_empty_states_stays_empty():
    from cuflash import reference

    m, l = reference.merge_states((-np.inf, 0.0), (-np.inf, 0.0))
    assert m == -np.inf and l == 0.0
    m, l = reference.merge_states((-np.inf, 0.0), (2.0, 3.0))
    assert (m, l) == (2.0, 3.0)


def test_non_cupy_input_is_a_type_error():
    pytest.importorskip("cupy")
    import cuflash

    for f in (cuflash.softmax, cuflash.log_softmax, cuflash.logsumexp, cuflash.online_softmax_state):
        with pytest.raises(TypeError, match="CuPy"):
            f(np.zeros((2, 3), np.float32))
        with pytest.raises(TypeError):
            f([1.0, 2.0])


# ----------------------------------------------------------------------------------------------------------
# GPU: the handed cases
@gpu
def test_case_all_neg_inf_row():
    import cuflash

    x = _to_device([[-np.inf] * 3], np.float32)
    assert np.all(np.isnan(cuflash.softmax(x, axis=-1).get()))
    assert np.all(np.isnan(cuflash.log_softmax(x, axis=-1).get()))
    assert cuflash.logsumexp(x, axis=-1).get().tolist() == [-np.inf]
    for p in ({"single_read": False}, {"chunks": 3}):  # the split and the two-launch path too
        assert np.all(np.isnan(sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p).get()))
        assert sm._reduce_impl(x, (1,), sm.OP_LSE, "online", p).get().tolist() == [-np.inf]


@gpu
def test_case_pos_inf():
    import cuflash

    x = _to_device([[0.0, np.inf], [np.inf, np.inf]], np.float32)
    assert np.all(np.isnan(cuflash.softmax(x, axis=-1).get()))
    assert cuflash.logsumexp(x, axis=-1).get().tolist() == [np.inf, np.inf]
    ls = cuflash.log_softmax(x, axis=-1).get()  # scipy: -inf beside a +inf, NaN at it
    np.testing.assert_array_equal(ls, scipy.special.log_softmax(np.array([[0.0, np.inf], [np.inf, np.inf]]), axis=-1))


@gpu
def test_case_neg_inf_entry():
    import cuflash

    x = _to_device([[0.0, -np.inf]], np.float32)
    assert cuflash.softmax(x, axis=-1).get().tolist() == [[1.0, 0.0]]
    assert cuflash.log_softmax(x, axis=-1).get().tolist() == [[0.0, -np.inf]]


@gpu
def test_case_empty(cp):
    import cuflash

    z = cp.zeros((2, 0), np.float32)
    assert cuflash.logsumexp(z, axis=1).get().tolist() == [-np.inf, -np.inf]
    out, sgn = cuflash.logsumexp(z, axis=1, return_sign=True)
    assert sgn.get().tolist() == [-1.0, -1.0]  # scipy: sign(-inf)
    assert cuflash.logsumexp(z, axis=1, keepdims=True).shape == (2, 1)
    for f in (cuflash.softmax, cuflash.log_softmax):
        with pytest.raises(ValueError):
            f(z, axis=1)
        with pytest.raises(ValueError):
            f(cp.zeros((0, 3), np.float32), axis=0)
    for f in (cuflash.softmax, cuflash.log_softmax, cuflash.logsumexp):
        e = f(cp.zeros((0, 3), np.float32), axis=1)
        assert e.shape == ((0, 3) if f is not cuflash.logsumexp else (0,)) and e.dtype == np.float32
    m, l = cuflash.online_softmax_state(z, axis=1)
    assert m.get().tolist() == [-np.inf, -np.inf] and l.get().tolist() == [0.0, 0.0]


@gpu
def test_case_transposed_axis():
    import cupy
    import cuflash

    x = cupy.arange(1, 13, dtype=cupy.float32).reshape(3, 4).T  # row 0 is [1, 5, 9]
    y = cuflash.softmax(x, axis=1).get()
    # The case lists [0.00032932, 0.01798621, 0.98168447]; exact values are e^-8, e^-4, 1 over 1 + e^-4 + e^-8 =
    # [0.00032932, 0.01798029, 0.98169039] (its last two entries are off by 3e-4 and 6e-6 relative): check the
    # exact ones at the case's rtol, and the whole array against float64 scipy.
    np.testing.assert_allclose(y[0], np.exp([-8.0, -4.0, 0.0]) / (1 + np.exp(-4.0) + np.exp(-8.0)), rtol=1e-5)
    np.testing.assert_allclose(y, scipy.special.softmax(x.get().astype(np.float64), axis=1), rtol=1e-6)


@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_case_row_lengths_around_paths(dtype, rng):
    for n in CASE_LENGTHS:
        _compare_all(rng.standard_normal((3, n)) * 10, dtype)


@gpu
@pytest.mark.parametrize("cols", [3, 100])
def test_case_many_rows(cols, rng, cp):
    import cuflash

    x64 = rng.standard_normal((70000, cols))
    poison = cp.full(70000 * cols, np.nan, np.float32)  # the pool hands this block to the output next
    del poison
    y = cuflash.softmax(_to_device(x64, np.float32), axis=-1).get()
    assert not np.isnan(y).any(), "rows left unwritten"
    np.testing.assert_allclose(y, scipy.special.softmax(x64.astype(np.float32).astype(np.float64), axis=-1),
                               rtol=2e-6, atol=1e-8)


@gpu
def test_case_merge_empty_states(cp):
    import cuflash

    e = (cp.asarray([-np.inf], np.float32), cp.asarray([0.0], np.float32))
    m, l = cuflash.merge_states(e, e)
    assert m.get().tolist() == [-np.inf] and l.get().tolist() == [0.0]
    m, l = cuflash.merge_states(e, (cp.asarray([2.0], np.float32), cp.asarray([3.0], np.float32)))
    assert m.get().tolist() == [2.0] and l.get().tolist() == [3.0]
    m, l = cuflash.merge_states((cp.asarray([2.0], np.float32), cp.asarray([3.0], np.float32)), e)
    assert m.get().tolist() == [2.0] and l.get().tolist() == [3.0]
    assert cuflash.lse_from_state(e).get().tolist() == [-np.inf]


# ----------------------------------------------------------------------------------------------------------
# GPU: every path switch and tail, each dtype; aligned and misaligned rows
@gpu
@pytest.mark.parametrize("dtype", list(ALL_DTYPES.values()), ids=list(ALL_DTYPES))
def test_every_switch_and_tail(dtype, rng):
    for n in _switch_lengths(dtype):
        x64 = rng.standard_normal((3, n)) * 8
        _compare_all(x64, dtype)
        # the same rows starting one element past a 16-byte boundary (misaligned head, view of a wider array)
        wide = _to_device(np.concatenate([np.zeros((3, 1)), x64], axis=1), dtype)
        _compare_all(x64, dtype, x_dev=wide[:, 1:], ops=("softmax", "logsumexp"))


@gpu
@pytest.mark.parametrize("dtype", list(ALL_DTYPES.values()), ids=list(ALL_DTYPES))
def test_contiguous_views_starting_inside_a_slot(dtype, rng, cp):
    """C-contiguous inputs whose first element is not on a 16-byte boundary (``flat[k:].reshape(...)``): the
    softmax output, a fresh allocation, starts on one, so the kernels need the input copied; it was passed as it
    was (``cupy.ascontiguousarray`` returns a C-contiguous view unchanged) and the kernels stored misaligned
    vectors (cudaErrorMisalignedAddress, found by experiments/scratch/newuser_probe.py). Every path: warp, block,
    the split, and the cluster / held rows on compute capability 9.0; one row and several; each start offset."""
    import cuflash

    vec = 16 // np.dtype(dtype).itemsize
    long_row = 300_000 if np.dtype(dtype).itemsize == 4 else 600_000  # >= 1 MiB: cluster (C = 16) or split
    for n in (1, 7, 100, 1024, 4097, 24576, 65537, long_row):
        for rows in (1, 3):
            x64 = rng.standard_normal((rows, n)) * 6
            for off in sorted({1, vec // 2, vec - 1} - {0}):
                flat = _to_device(np.concatenate([np.full(off, 7.0), x64.ravel(), np.full(3, -7.0)]), dtype)
                xv = flat[off:off + rows * n].reshape(rows, n)
                assert xv.flags.c_contiguous and xv.data.ptr % 16, (n, rows, off)
                ops = ("softmax", "log_softmax", "logsumexp") if n < long_row or off == 1 else ("softmax",)
                _compare_all(x64, dtype, x_dev=xv, ops=ops)
                m, l = cuflash.online_softmax_state(xv, axis=-1)
                m2, l2 = cuflash.online_softmax_state(xv.copy(), axis=-1)
                np.testing.assert_allclose(m.get(), m2.get(), rtol=0, atol=0)
                np.testing.assert_allclose(l.get(), l2.get(), rtol=2 * _dtypes.tolerance(l.dtype, n)[1])
            if rows == 1:  # the 1-D form, axis None
                flat = _to_device(np.concatenate([[1.0], x64[0]]), dtype)
                _compare_all(x64[0], dtype, axis=None, x_dev=flat[1:], ops=("softmax",))


FORCED = [("warp", None), ("block", {"threads": 512, "chunks": 1}), ("split", {"chunks": 5}),
          ("split", {"chunk_slots": 64}), ("split_regs", {"split": "registers", "chunks": 5}),
          ("stream", {"single_read": False}), ("stream", {"chunks": 7, "single_read": False})]


@gpu
@pytest.mark.parametrize("path,part", FORCED)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_forced_paths_agree(path, part, dtype, rng):
    n = 250 if path == "warp" else 3001
    x64 = rng.standard_normal((5, n)) * 5
    x64[1, ::3] = -np.inf
    x64[2] = -np.inf
    xd = _to_device(x64, dtype)
    for op, f in ((sm.OP_SOFTMAX, scipy.special.softmax), (sm.OP_LOG_SOFTMAX, scipy.special.log_softmax)):
        y, pl = sm._softmax_impl(xd, -1, op, "online", part, return_plan=True)
        assert pl.path == path, pl
        r, b = _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1)
        _check(y.get(), r, b, dtype, n, f"{f.__name__} {pl}")
    lse, pl = sm._reduce_impl(xd, (1,), sm.OP_LSE, "online", part, return_plan=True)
    f = scipy.special.logsumexp
    _check(lse.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n, f"lse {pl}")


FAST_EXP_PATHS = FORCED + [("safe", "safe"), ("cluster", {"path": "cluster", "cluster": 1}),
                            ("cluster", {"path": "cluster", "cluster": 4})]


@gpu
@pytest.mark.parametrize("path,part", FAST_EXP_PATHS)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_fast_exponent_threshold(path, part, dtype, rng):
    """16-bit inputs take exp2(x·log2e − mc) (one FFMA, mc the rounded m·log2e) when the row max |m| <=
    FAST_EXP_MAX_M (1024) and exp(x − m) beyond; float32 always the latter. Rows whose max sits on either side of
    the threshold, on both signs, against float64 scipy; bfloat16 rows at ±2^100 (all equal there), where m·log2e
    loses 77 bits and the fast form would give inf/NaN. One-hot rows (a single finite entry, m = 992 .. 1024):
    the state's l must be 1 (the sum corrected by 2^-(m·log2e − mc)) and log_softmax of that entry 0, both to
    1e-6 — without the correction l is off by up to 4e-5."""
    if path == "cluster":
        _needs_cluster()
    n = 250 if path == "warp" else 3001
    offsets = [-3072.0, -1032.0, -1024.0, -1016.0, -300.0, 0.0, 300.0, 1016.0, 1024.0, 1032.0, 8192.0]
    if np.dtype(dtype) == _dtypes.bfloat16:
        offsets += [2.0 ** 100, -(2.0 ** 100)]
    x64 = rng.standard_normal((len(offsets), n)) * 6
    x64 -= x64.max(axis=1, keepdims=True)  # every row's max is exactly its offset (after the cast below)
    x64 += np.array(offsets)[:, None]
    x64 = x64.astype(dtype).astype(np.float64)
    assert (x64.max(axis=1) == offsets).all()
    xd = _to_device(x64, dtype)
    method, part = ("safe", None) if part == "safe" else ("online", part)
    for op, f in ((sm.OP_SOFTMAX, scipy.special.softmax), (sm.OP_LOG_SOFTMAX, scipy.special.log_softmax)):
        y = sm._softmax_impl(xd, -1, op, method, part)
        _check(y.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n, f.__name__)
    lse = sm._reduce_impl(xd, (1,), sm.OP_LSE, method, part)
    f = scipy.special.logsumexp
    _check(lse.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n, "lse")

    peaks = np.arange(992.0, 1025.0, 4.0)  # exact in float16 and bfloat16
    hot = np.full((len(peaks), n), -np.inf)
    hot[np.arange(len(peaks)), rng.integers(0, n, len(peaks))] = peaks
    hd = _to_device(hot, dtype)
    m, l = sm._reduce_impl(hd, (1,), sm.OP_STATE, method, part)
    assert m.get().tolist() == peaks.tolist()
    np.testing.assert_allclose(l.get(), 1.0, rtol=0, atol=1e-6)
    ls = sm._softmax_impl(hd, -1, sm.OP_LOG_SOFTMAX, method, part).get().astype(np.float64)
    np.testing.assert_allclose(ls[np.isfinite(hot)], 0.0, rtol=0, atol=1e-6)
    assert np.isneginf(ls[~np.isfinite(hot)]).all()


@gpu
@pytest.mark.parametrize("method", ["safe", "naive"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_methods(method, dtype, rng):
    for n in (7, 1000, 70001):
        _compare_all(rng.standard_normal((4, n)) * 3, dtype, method=method)


@gpu
def test_naive_overflows_by_design():
    import cuflash

    x = _to_device([[1000.0, 0.0]], np.float32)
    assert np.isnan(cuflash.softmax(x, axis=-1, method="naive").get()).any()
    assert cuflash.softmax(x, axis=-1, method="safe").get().tolist() == [[1.0, 0.0]]
    assert cuflash.softmax(x, axis=-1).get().tolist() == [[1.0, 0.0]]


@gpu
def test_split_row_is_deterministic(rng):
    x = _to_device(rng.standard_normal((2, 300000)), np.float32)
    for p in ({"chunks": 37}, {"split": "registers", "chunks": 37}):
        a = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p)
        b = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p)
        assert bool((a == b).all())


# ----------------------------------------------------------------------------------------------------------
# GPU: layouts and axes
@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_axes_and_strides(dtype, rng, cp):
    x64 = rng.standard_normal((6, 37, 41)) * 4
    xd = _to_device(x64, dtype)
    for axis in (0, 1, 2, -1, (0, 2), (1, 2), (0, 1, 2), None):
        _compare_all(x64, dtype, axis=axis, x_dev=xd)
    for axis in (np.int64(1), np.array(2), np.array(-1)):  # NumPy integers and 0-d arrays, as scipy takes them
        _compare_all(x64, dtype, axis=axis, x_dev=xd)
    # non-contiguous views: steps, reversed, transposed, a slice of the reduced axis
    for view, v64 in ((xd[:, ::2, :], x64[:, ::2, :]), (xd[::-1, :, ::-1], x64[::-1, :, ::-1]),
                      (xd.transpose(2, 0, 1), x64.transpose(2, 0, 1)), (xd[:, :, 3:30], x64[:, :, 3:30])):
        for axis in (-1, 0, (1, 2)):
            _compare_all(np.ascontiguousarray(v64), dtype, axis=axis, x_dev=view)
    # logsumexp keepdims and 0-d input
    import cuflash

    k = cuflash.logsumexp(xd, axis=(0, 2), keepdims=True)
    assert k.shape == (1, 37, 1)
    s = cuflash.logsumexp(xd[0, 0, 0])
    assert s.shape == () and cuflash.softmax(xd[0, 0, 0]).get() == 1.0


@gpu
def test_torch_tensor_zero_copy():
    torch = pytest.importorskip("torch")
    import cuflash

    t = torch.randn(4, 100, device="cuda")
    np.testing.assert_allclose(cuflash.softmax(t, axis=-1).get(), torch.softmax(t, -1).cpu().numpy(), rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------
# GPU: edge values, logsumexp with b and return_sign
EDGE_ROWS = [[0.0, -np.inf, 1.0], [-np.inf] * 3, [np.inf, 0.0, 1.0], [np.inf, np.inf, -np.inf], [np.nan, 0.0, 1.0],
             [np.nan, np.inf, -np.inf], [1e4, -1e4, 0.0], [-1e30, -1e30, -1e30], [3.0, 3.0, 3.0]]


@gpu
@pytest.mark.parametrize("dtype", list(ALL_DTYPES.values()), ids=list(ALL_DTYPES))
def test_edge_values_match_scipy(dtype):
    x64 = np.array(EDGE_ROWS)
    if np.dtype(dtype).itemsize == 2:
        x64 = np.clip(x64, -6e4, 6e4)  # finite in half precision
    _compare_all(x64, dtype)
    for p in ({"chunks": 2}, {"single_read": False}):
        y = sm._softmax_impl(_to_device(x64, dtype), -1, sm.OP_SOFTMAX, "online", p).get().astype(np.float64)
        r = _ref(scipy.special.softmax, x64, dtype, axis=-1)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(r))


@gpu
def test_logsumexp_return_sign_and_weights(rng, cp):
    import cuflash

    x64 = np.array(EDGE_ROWS)
    out, sgn = cuflash.logsumexp(_to_device(x64, np.float32), axis=-1, return_sign=True)
    r_out, r_sgn = scipy.special.logsumexp(x64.astype(np.float32), axis=-1, return_sign=True)
    np.testing.assert_allclose(out.get(), r_out, rtol=1e-6)
    np.testing.assert_array_equal(sgn.get(), r_sgn)
    a = rng.standard_normal((5, 9))
    b = rng.standard_normal((5, 9))
    b[0, :4] = 0
    a[0, :4] = np.inf  # dropped with their zero weights
    for bb, rs in ((b, True), (np.abs(b), False), (2.0, False), (b[0], True)):
        got = cuflash.logsumexp(_to_device(a, np.float32), axis=-1, b=cp.asarray(bb) if isinstance(bb, np.ndarray)
                                else bb, return_sign=rs)
        want = scipy.special.logsumexp(a.astype(np.float32), axis=-1, b=bb, return_sign=rs)
        for g, w in zip(got if rs else (got,), want if rs else (want,)):
            assert g.dtype == np.asarray(w).dtype, (g.dtype, np.asarray(w).dtype)
            np.testing.assert_allclose(g.get(), w, rtol=1e-5, equal_nan=True)
    # negative sum without return_sign: NaN, as scipy
    assert np.isnan(cuflash.logsumexp(_to_device([1.0, 2.0], np.float32), b=cp.asarray([1.0, -1.0])).get())
    # integer and bool weights with a bfloat16 a: float16's promotion, bfloat16 in its place (NumPy has no rule;
    # int16 weights raised "no common dtype" before)
    ab = _to_device(a, _dtypes.bfloat16)
    for wdt, out_dt in ((np.int8, _dtypes.bfloat16), (np.bool_, _dtypes.bfloat16), (np.int16, np.float32),
                        (np.int32, np.float64), (np.int64, np.float64)):
        bw = (np.arange(45).reshape(5, 9) % 3).astype(wdt)
        got = cuflash.logsumexp(ab, axis=-1, b=cp.asarray(bw))
        assert got.dtype == np.dtype(out_dt), (wdt, got.dtype)
        want = scipy.special.logsumexp(a.astype(_dtypes.bfloat16).astype(np.float64), axis=-1, b=bw.astype(np.float64))
        np.testing.assert_allclose(got.get().astype(np.float64), want, rtol=8e-3, equal_nan=True)


# ----------------------------------------------------------------------------------------------------------
# GPU: the state, its merge, and property tests
@gpu
@pytest.mark.parametrize("dtype", list(ALL_DTYPES.values()), ids=list(ALL_DTYPES))
def test_state_and_lse(dtype, rng):
    import cuflash
    from cuflash import reference

    for n in (5, 700, 50000):
        x64 = rng.standard_normal((3, n)) * 6
        xd = _to_device(x64, dtype)
        m, l = cuflash.online_softmax_state(xd, axis=-1)
        assert m.dtype == (np.float64 if np.dtype(dtype) == np.float64 else np.float32)
        rm, rl = reference.online_softmax_state(x64.astype(dtype).astype(np.float64), axis=-1)
        np.testing.assert_array_equal(m.get(), rm.astype(m.dtype))  # the max is exact
        np.testing.assert_allclose(l.get(), rl, rtol=_dtypes.tolerance(np.float32, n)[1])
        lse = cuflash.lse_from_state((m, l))
        np.testing.assert_allclose(lse.get(), scipy.special.logsumexp(x64.astype(dtype).astype(np.float64), axis=-1),
                                   rtol=1e-5)
    m, l = cuflash.online_softmax_state(_to_device([[np.inf, np.inf, 0.0]], np.float32))
    assert m.get().tolist() == [np.inf] and l.get().tolist() == [2.0]  # lse_from_state -> +inf, as logsumexp


@gpu
def test_merge_states_property(cp):
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    import cuflash

    vals = st.one_of(st.floats(-50, 50, allow_nan=False, width=32), st.just(-np.inf))

    @hyp.settings(max_examples=60, deadline=None)
    @hyp.given(st.lists(vals, min_size=1, max_size=300), st.lists(st.integers(1, 300), min_size=1, max_size=6))
    def check(xs, cuts):
        x = np.asarray(xs, np.float32)
        bounds = sorted({min(c, len(x)) for c in cuts} | {0, len(x)})
        parts = [cp.asarray(x[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        state = cuflash.online_softmax_state(parts[0])
        for p in parts[1:]:
            state = cuflash.merge_states(state, cuflash.online_softmax_state(p))
        whole = cuflash.online_softmax_state(cp.asarray(x))
        assert float(state[0]) == float(whole[0])  # max is exact, -inf included
        if np.isneginf(x).all():
            assert float(state[1]) == 0.0 and float(whole[1]) == 0.0
        else:
            assert float(state[1]) == pytest.approx(float(whole[1]), rel=1e-5)
        lse = float(cuflash.lse_from_state(state))
        ref = scipy.special.logsumexp(x.astype(np.float64))
        assert lse == ref or abs(lse - ref) <= 1e-5 * max(1.0, abs(ref))

    check()


@gpu
def test_softmax_rows_sum_to_one_property(cp):
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    import cuflash

    @hyp.settings(max_examples=40, deadline=None)
    @hyp.given(st.integers(1, 70000), st.integers(1, 4), st.floats(0.01, 80), st.sampled_from(list(DTYPES)))
    def check(n, rows, scale, dname):
        dt = DTYPES[dname]
        x = (cp.random.standard_normal((rows, n), dtype=cp.float32) * scale).astype(dt)
        s = cuflash.softmax(x, axis=-1).astype(cp.float64).sum(axis=-1).get()
        assert np.all(np.abs(s - 1) <= 2 * _dtypes.eps(dt) + _dtypes.tolerance(dt, n)[1]), (s, n, dname)

    check()


# ----------------------------------------------------------------------------------------------------------
# GPU: bad input raises before any launch
@gpu
def test_bad_input(cp):
    import cuflash

    for bad in (cp.zeros((2, 3), np.int32), cp.zeros((2, 3), np.complex64), cp.zeros((2, 3), bool)):
        for f in (cuflash.softmax, cuflash.log_softmax, cuflash.logsumexp, cuflash.online_softmax_state):
            with pytest.raises(TypeError, match="dtype"):
                f(bad)
    x = cp.zeros((2, 3), np.float32)
    for f in (cuflash.softmax, cuflash.log_softmax, cuflash.logsumexp, cuflash.online_softmax_state):
        for axis in (2, -3, (0, 0), (0, 5)):
            with pytest.raises(ValueError):
                f(x, axis=axis)
        with pytest.raises(TypeError):
            f(x, axis=1.5)
    with pytest.raises(ValueError, match="method"):
        cuflash.softmax(x, method="fast")
    with pytest.raises(TypeError):
        cuflash.merge_states((x, x), 1.0)


# ----------------------------------------------------------------------------------------------------------
# GPU, slow: more than 2^32 elements (64-bit offsets)
@gpu
@pytest.mark.slow
def test_more_than_2_to_32_elements(cp):
    import cuflash

    rows, n = 4096, 1_048_577
    try:
        x = cp.empty((rows, n), dtype=np.float16)
    except cp.cuda.memory.OutOfMemoryError:
        pytest.skip("not enough device memory for 2 x 8.6 GB")
    assert x.size > 2**32
    for r0 in range(0, rows, 512):  # fill in pieces (a float32 temporary of the whole would be 17 GB)
        x[r0:r0 + 512] = cp.random.standard_normal((512, n), dtype=cp.float32).astype(np.float16)
    y = cuflash.softmax(x, axis=-1)
    for r in (0, 2047, rows - 1):  # the last rows sit past 2^32 elements
        x64 = x[r].get().astype(np.float64)
        # float16 outputs near 1e-7 are subnormal (spacing 6e-8): an absolute floor of one spacing
        np.testing.assert_allclose(y[r].get().astype(np.float64), scipy.special.softmax(x64), rtol=2e-3, atol=6e-8)
    lse = cuflash.logsumexp(x, axis=-1)
    np.testing.assert_allclose(float(lse[rows - 1]), scipy.special.logsumexp(x[rows - 1].get().astype(np.float64)),
                               rtol=2e-3)


# ----------------------------------------------------------------------------------------------------------
# the cluster path (compute capability >= 9.0): a row over a thread-block cluster of C blocks
CC_H200 = 90


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_plan(dtype, monkeypatch):
    monkeypatch.setattr(sm, "HELD_ROW_BYTES", None)  # the cluster planner alone (the held path: test_held_plan)
    vec = 16 // np.dtype(dtype).itemsize
    lo, hi = sm.CLUSTER_ROW_BYTES[np.dtype(dtype).itemsize]
    long_n, top_n = lo // np.dtype(dtype).itemsize, hi // np.dtype(dtype).itemsize
    # automatic: long rows, enough rows to cover the SMs, softmax/log_softmax, method online, cc >= 9.0 only
    p = sm.plan(dtype, 8192, long_n, sms=SMS, cc=CC_H200)
    assert p.path == "cluster" and p.chunks in sm.CLUSTER_SIZES and p.threads == sm.CLUSTER_THREADS
    assert sm.plan(dtype, 8192, long_n, op=sm.OP_LOG_SOFTMAX, sms=SMS, cc=CC_H200).path == "cluster"
    for cc in (None, 80, 89):
        assert sm.plan(dtype, 8192, long_n, sms=SMS, cc=cc) == sm.plan(dtype, 8192, long_n, sms=SMS)
    assert sm.plan(dtype, 8192, long_n - 1, sms=SMS, cc=CC_H200).path != "cluster"
    assert sm.plan(dtype, 1024, top_n, sms=SMS, cc=CC_H200).path == "cluster"
    assert sm.plan(dtype, 1024, top_n + 1, sms=SMS, cc=CC_H200).path != "cluster"
    assert sm.plan(dtype, 8192, long_n, method="safe", sms=SMS, cc=CC_H200).path == "stream"
    assert sm.plan(dtype, 8192, long_n, op=sm.OP_LSE, sms=SMS, cc=CC_H200).path != "cluster"
    assert sm.plan(dtype, 4, 1 << 20, sms=SMS, cc=CC_H200).path == "split"  # 4 rows x 8 blocks < SMs
    assert sm.plan(dtype, 8192, long_n, sms=SMS, cc=CC_H200, partition={"cluster": 0}) == \
        sm.plan(dtype, 8192, long_n, sms=SMS)
    assert sm.plan(dtype, 8192, long_n, sms=SMS, cc=CC_H200, partition={"chunks": 5}).path == "split"
    monkeypatch.setattr(sm, "CLUSTER_ROW_BYTES", None)
    assert sm.plan(dtype, 8192, long_n, sms=SMS, cc=CC_H200).path != "cluster"
    monkeypatch.undo()
    monkeypatch.setattr(sm, "HELD_ROW_BYTES", None)
    # C: the smallest size whose segments fit CLUSTER_SEGMENT_BYTES with rows x C >= SMs, else the largest (16 on
    # cc 9.0 only, 8 elsewhere); segments over CLUSTER_MAX_SEGMENT_BYTES or too few blocks: not the cluster path
    for cc in (CC_H200, 100):
        sizes = [c for c in sm.CLUSTER_SIZES if c <= 8 or cc == CC_H200]
        for rows, n in ((8192, 1 << 15), (1024, 1 << 16), (512, 1 << 17), (64, 1 << 20), (40, 1 << 16),
                        (17, 1 << 16), (8192, 1 << 14), (9, 1 << 18), (256, 3 << 17), (128, 1 << 19)):
            p = sm.plan(dtype, rows, n, sms=SMS, cc=cc)
            nbytes = n * np.dtype(dtype).itemsize
            want = next((c for c in sizes if nbytes <= c * sm.CLUSTER_SEGMENT_BYTES and rows * c >= SMS), sizes[-1])
            if lo <= nbytes <= hi and rows * want >= SMS and nbytes <= want * sm.CLUSTER_MAX_SEGMENT_BYTES:
                assert (p.path, p.chunks) == ("cluster", want), (cc, rows, n, p)
            else:
                assert p.path != "cluster", (cc, rows, n, p)
    mib = (1 << 20) // np.dtype(dtype).itemsize  # elements of a 1 MiB row
    assert sm.plan(dtype, 256, mib, sms=SMS, cc=CC_H200).chunks == 16  # held whole over 16 blocks
    assert sm.plan(dtype, 256, mib, sms=SMS, cc=100).chunks == 8  # 64 KiB of each 128 KiB segment held
    assert sm.plan(dtype, 128, 2 * mib, sms=SMS, cc=CC_H200).chunks == 16
    assert sm.plan(dtype, 128, 2 * mib, sms=SMS, cc=100).path == "split"
    assert sm.plan(dtype, 64, 4 * mib, sms=SMS, cc=CC_H200).path == "split"
    # forced: any length, any C, every op; capacity C x S covers the row (aligned or not)
    for n in sorted({1, 2, vec - 1, vec + 1, 1000, 3001, 65537, 1 << 20} - {0}):
        for c in sm.CLUSTER_SIZES:
            for aligned in (True, False):
                for op in (sm.OP_SOFTMAX, sm.OP_LSE, sm.OP_STATE):
                    p = sm.plan(dtype, 3, n, op=op, aligned=aligned, sms=SMS, cc=CC_H200,
                                partition={"path": "cluster", "cluster": c})
                    slots = -(-(n + (0 if aligned else vec - 1)) // vec)
                    assert p.path == "cluster" and p.chunks == c and c * p.slots_per_chunk >= slots
                    assert p.slots_per_chunk == -(-slots // c)  # (short rows leave the last blocks empty)
    assert sm.plan(dtype, 3, 100, sms=SMS, cc=CC_H200, partition={"path": "cluster"}).path == "cluster"
    from cuflash import _compile

    with pytest.raises(_compile.ConfigurationError, match="9.0"):
        sm.plan(dtype, 3, 100, sms=SMS, cc=80, partition={"path": "cluster"})
    with pytest.raises(ValueError, match="online"):
        sm.plan(dtype, 3, 100, method="safe", sms=SMS, cc=CC_H200, partition={"path": "cluster"})
    with pytest.raises(ValueError, match="cluster size"):
        sm.plan(dtype, 3, 100, sms=SMS, cc=CC_H200, partition={"path": "cluster", "cluster": 32})
    with pytest.raises(ValueError, match="path"):
        sm.plan(dtype, 3, 100, sms=SMS, cc=CC_H200, partition={"path": "clusterr"})
    # the copy: bulk for CLUSTER_BULK_SIZES with the segment held whole, else cp.async; forced either way
    for rows, n in ((8192, 1 << 15), (1024, 1 << 16), (512, 1 << 17), (256, mib), (128, 2 * mib), (100, 3001)):
        for c in sm.CLUSTER_SIZES:
            p = sm.plan(dtype, rows, n, sms=SMS, cc=CC_H200, partition={"path": "cluster", "cluster": c})
            held = p.slots_per_chunk * 16 <= sm.CLUSTER_HOLD_BYTES
            assert p.copy == ("bulk" if c in sm.CLUSTER_BULK_SIZES and held else "cp.async"), (rows, n, p)
            for copy in sm.CLUSTER_COPIES:
                assert sm.plan(dtype, rows, n, sms=SMS, cc=CC_H200,
                               partition={"path": "cluster", "cluster": c, "copy": copy}).copy == copy
    assert sm.plan(dtype, 8192, long_n, sms=SMS, cc=CC_H200).copy == "bulk"  # C = 2, held whole
    assert sm.plan(dtype, 8192, 1000, sms=SMS, cc=CC_H200).copy is None  # other paths: no copy
    forced = {"path": "cluster", "cluster": 8}
    for op in (sm.OP_LSE, sm.OP_STATE):  # lse / state hold nothing (they stream): no copy to make faster
        assert sm.plan(dtype, 64, long_n, op=op, sms=SMS, cc=CC_H200, partition=forced).copy == "cp.async"
        assert sm.plan(dtype, 64, long_n, op=op, sms=SMS, cc=CC_H200,
                       partition=dict(forced, hold_bytes=sm.CLUSTER_HOLD_BYTES)).copy == "bulk"
    assert sm.plan(dtype, 64, long_n, sms=SMS, cc=CC_H200, partition=dict(forced, hold_bytes=4096)).copy == "cp.async"
    for part in ({"path": "cluster", "copy": "tma"}, {"copy": "tma"}):  # rejected whichever path the call takes
        for cc in (CC_H200, 80):
            with pytest.raises(ValueError, match="copy"):
                sm.plan(dtype, 3, 100, sms=SMS, cc=cc, partition=part)


def test_cluster_never_for_float64():
    assert sm.plan(np.float64, 8192, 1 << 16, sms=SMS, cc=CC_H200).path == "stream"
    with pytest.raises(ValueError):
        sm.plan(np.float64, 3, 100, sms=SMS, cc=CC_H200, partition={"path": "cluster"})


def test_cluster_kernels_declared_for_sm90_only():
    from cuflash import _compile

    decl = {(n, e) for s, n, e, _ in _compile.declared() if s == sm.SOURCE and "softmax_cluster" in n}
    want = {(sm._cluster_name(_dtypes.CTYPE[dt], c, cp), sm.CLUSTER_ARCH_OPTIONS) for dt in DTYPES.values()
            for c in sm.CLUSTER_SIZES for cp in sm.CLUSTER_COPIES}
    assert decl == want  # declared once each, with the sm_90 option (test_compile builds them for sm_90 only)


def _needs_cluster():
    import cupy

    cc = int(cupy.cuda.Device().compute_capability)
    if cc < 90:
        pytest.skip(f"the cluster path needs compute capability >= 9.0 (device: {cc})")


def _poisoned(cp, shape, dtype, byte=0xFF):
    """An output array whose every byte is ``byte`` (0xFF: NaN in float16, bfloat16 and float32; 0x3C: a finite
    value, for outputs whose right answer is NaN): unwritten entries show."""
    a = cp.empty(shape, dtype=dtype)
    a.view(cp.uint8)[...] = byte
    return a


def _cluster_run(x, op, part, cp):
    """One forced cluster launch on rows of x (last axis) into poisoned outputs: the outputs (CuPy) and the Plan."""
    pr = sm._prepare(x, -1, op, "online", part)
    assert pr.plan.path == "cluster" and pr.plan.chunks == part.get("cluster", pr.plan.chunks), pr.plan
    assert pr.plan.copy == part.get("copy", pr.plan.copy), pr.plan
    from cuflash import _compile  # the launch runs the instantiation of the plan's copy (BULK template argument)

    want = sm._cluster_name(_dtypes.CTYPE[np.dtype(x.dtype)], pr.plan.chunks, pr.plan.copy)
    assert pr.kernels[0] is _compile.get_kernel(sm.SOURCE, want, sm.CLUSTER_ARCH_OPTIONS), (want, pr.plan)
    if op < sm.OP_LSE:
        y = _poisoned(cp, x.shape, x.dtype)
        sm._exec(pr, x, op, "online", y=y)
        return y, pr.plan
    if op == sm.OP_LSE:
        y = _poisoned(cp, x.shape[:-1], x.dtype)
        sm._exec(pr, x, op, "online", y=y)
        return y, pr.plan
    m, l = _poisoned(cp, x.shape[:-1], np.float32), _poisoned(cp, x.shape[:-1], np.float32)
    sm._exec(pr, x, op, "online", om=m, ol=l)
    return (m, l), pr.plan


def _cluster_compare(x64, dtype, part, cp, x_dev=None, ops=(sm.OP_SOFTMAX, sm.OP_LOG_SOFTMAX, sm.OP_LSE,
                                                            sm.OP_STATE)):
    """Every op of the forced cluster path on x64's rows against float64 scipy (_check's rule)."""
    xd = _to_device(x64, dtype) if x_dev is None else x_dev
    n = x64.shape[-1]
    fns = {sm.OP_SOFTMAX: scipy.special.softmax, sm.OP_LOG_SOFTMAX: scipy.special.log_softmax,
           sm.OP_LSE: scipy.special.logsumexp}
    for op in ops:
        out, pl = _cluster_run(xd, op, part, cp)
        if op == sm.OP_STATE:  # m is exact (NaN-propagating max); m + log(l) is the logsumexp
            m, l = out[0].get().astype(np.float64), out[1].get().astype(np.float64)
            xr = x64.astype(dtype).astype(np.float64)
            np.testing.assert_array_equal(m, np.max(xr, axis=-1))
            with np.errstate(all="ignore"):
                lse = m + np.log(l)
            f = scipy.special.logsumexp  # of the data as the kernel read it, in float32 (the state's type)
            _check(lse, _ref(f, xr, np.float32, axis=-1), _baseline(f, xr, np.float32, axis=-1), np.float32, n,
                   f"state {pl}")
            continue
        f = fns[op]
        _check(out.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n,
               f"{f.__name__} {pl}")


def _cluster_lengths(dtype, c):
    """Row lengths around the segment boundaries of a C-block cluster and the vector tails."""
    vec = 16 // np.dtype(dtype).itemsize
    t = sm.CLUSTER_THREADS
    out = {1, 2, 3, vec - 1, vec, vec + 1, 3001}
    for e in (c * vec, c * vec * t, c * vec * t * 4, c * vec * t * 9):  # a slot, a thread sweep, the groups
        out |= {e - vec, e - 1, e, e + 1, e + vec}
    return sorted(x for x in out if x >= 1)


@gpu
@pytest.mark.parametrize("copy", sm.CLUSTER_COPIES)
@pytest.mark.parametrize("c", sm.CLUSTER_SIZES)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_every_size_boundaries_and_tails(dtype, c, copy, rng, cp):
    _needs_cluster()
    part = {"path": "cluster", "cluster": c, "copy": copy}
    for n in _cluster_lengths(dtype, c):
        x64 = rng.standard_normal((3, n)) * 8  # odd n: rows 1 and 2 start inside a 16-byte slot
        _cluster_compare(x64, dtype, part, cp)
        # row 0 unaligned too: a view one element into a wider array (lse/state read it in place)
        wide = _to_device(np.concatenate([np.zeros((3, 1)), x64], axis=1), dtype)
        _cluster_compare(x64, dtype, part, cp, x_dev=wide[:, 1:])


@gpu
@pytest.mark.parametrize("copy", sm.CLUSTER_COPIES)
@pytest.mark.parametrize("c", sm.CLUSTER_SIZES)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_rows_longer_than_shared_memory(dtype, c, copy, rng, cp):
    """The segment's part past the held slots streams (and is re-read): a small hold, no hold, and rows longer
    than C x CLUSTER_HOLD_BYTES with the default hold."""
    _needs_cluster()
    vec = 16 // np.dtype(dtype).itemsize
    for hold in (16 * 300, 16 * 1000 + 16, 0):
        for n in (c * vec * 300 + 1, c * vec * 1000 + 7, 12345, 200003):
            _cluster_compare(rng.standard_normal((2, n)) * 8, dtype,
                             {"path": "cluster", "cluster": c, "hold_bytes": hold, "copy": copy}, cp)
    n = c * sm.CLUSTER_HOLD_BYTES // np.dtype(dtype).itemsize * 3 // 2 + 3  # 1.5x what the cluster holds
    x64 = rng.standard_normal((2, n)) * 8
    x64[1, -5:] = 40.0  # the row's max in the streamed part of the last segment
    _cluster_compare(x64, dtype, {"path": "cluster", "cluster": c, "copy": copy}, cp)


@gpu
@pytest.mark.parametrize("copy", sm.CLUSTER_COPIES)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_fewer_and_more_rows_than_clusters(dtype, copy, rng, cp):
    _needs_cluster()
    for c in sm.CLUSTER_SIZES:
        for rows, clusters in ((1, None), (2, 5), (7, 3), (9, 1), (64, 4)):
            part = {"path": "cluster", "cluster": c, "copy": copy}
            if clusters:
                part["clusters"] = clusters
            x64 = rng.standard_normal((rows, 5003)) * 6
            _cluster_compare(x64, dtype, part, cp)
            _, pl = _cluster_run(_to_device(x64, dtype), sm.OP_SOFTMAX, part, cp)
            assert pl.chunks == c


def _edge_rows(n, dtype):
    """Rows of n elements with the edge values spread over the segments (n >= 64)."""
    big = 6e4 if np.dtype(dtype).itemsize == 2 else 1e30
    rows = np.tile(np.linspace(-3.0, 3.0, n), (12, 1))
    rows[0] = -np.inf  # all -inf: every segment's state is empty
    rows[1, :] = -np.inf
    rows[1, n // 2] = 0.5  # one finite entry: the other segments are empty, merged in
    rows[2, n - 1] = np.inf  # +inf in the last segment
    rows[3, [0, n // 3, n - 1]] = np.inf  # several +inf
    rows[4, n // 2] = np.nan
    rows[5, 0] = np.nan
    rows[5, n - 1] = np.inf
    rows[6] = 3.0  # all equal
    rows[7, ::2] = big  # huge values (fp32: 1e30; 16-bit: 6e4)
    rows[7, 1::2] = -big
    rows[8] = -big  # huge negative, all equal
    rows[9, ::3] = -np.inf  # -inf entries beside finite ones
    rows[10, : n // 2] = -np.inf  # the first segments empty
    rows[11, n // 2:] = -np.inf  # the last segments empty
    return rows


@gpu
@pytest.mark.parametrize("copy", sm.CLUSTER_COPIES)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_edge_values_match_scipy(dtype, copy, cp):
    _needs_cluster()
    for c in sm.CLUSTER_SIZES:
        for n in (64, 3001, 40001):
            x64 = _edge_rows(n, dtype)
            _cluster_compare(x64, dtype, {"path": "cluster", "cluster": c, "copy": copy}, cp)
            _cluster_compare(x64, dtype, {"path": "cluster", "cluster": c, "hold_bytes": 16 * 256, "copy": copy}, cp)
    (m, l), _ = _cluster_run(_to_device([[np.inf, 0.0] * 50, [-np.inf] * 100], np.float32), sm.OP_STATE,
                             {"path": "cluster", "cluster": 4}, cp)
    assert m.get().tolist() == [np.inf, -np.inf] and l.get().tolist() == [50.0, 0.0]  # +inf counts 1; empty stays


@gpu
def test_cluster_is_deterministic(rng, cp):
    _needs_cluster()
    x = _to_device(rng.standard_normal((3, 300001)), np.float32)
    for part in ({"path": "cluster", "cluster": 8}, {"path": "cluster", "cluster": 2, "hold_bytes": 4096}):
        a, _ = _cluster_run(x, sm.OP_SOFTMAX, part, cp)
        b, _ = _cluster_run(x, sm.OP_SOFTMAX, part, cp)
        assert bool((a == b).all())


@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_copies_give_the_same_bits(dtype, rng, cp):
    """Bulk copies and cp.async only move the bytes: every op's output is bitwise equal between the two, held
    whole or partly streamed, with two clusters taking the five rows (the row loop refills shared memory); the
    state also on rows one element into a wider array (softmax / log_softmax copy such an input first)."""
    _needs_cluster()
    for c in (1, 2, 4, 8, 16):
        for n, hold in ((c * 4099 + 5, None), (c * 9000 + 1, 16 * 1000)):
            x64 = rng.standard_normal((5, n)) * 8
            wide = _to_device(np.concatenate([np.zeros((5, 1)), x64], axis=1), dtype)
            for xd in (_to_device(x64, dtype), wide[:, 1:]):
                for op in (sm.OP_SOFTMAX, sm.OP_LOG_SOFTMAX, sm.OP_STATE):
                    outs = []
                    for copy in sm.CLUSTER_COPIES:
                        part = {"path": "cluster", "cluster": c, "copy": copy, "clusters": 2}
                        if hold is not None or op == sm.OP_STATE:
                            part["hold_bytes"] = hold if hold is not None else sm.CLUSTER_HOLD_BYTES
                        out, pl = _cluster_run(xd, op, part, cp)
                        assert pl.copy == copy
                        outs.append([a.get() for a in (out if isinstance(out, tuple) else (out,))])
                    for a, b in zip(*outs):
                        assert a.tobytes() == b.tobytes(), (c, n, hold, op)


_RACECHECK_CHILD = """
import importlib, sys, numpy as np, cupy as cp
sys.path.insert(0, '.')
sm = importlib.import_module('cuflash.softmax')
from cuflash import _dtypes
rng = np.random.default_rng()
for dt in (np.float32, _dtypes.bfloat16):
    for c, copy in ((1, 'cp.async'), (1, 'bulk'), (2, 'cp.async'), (2, 'bulk')):  # one cluster takes every row:
        x = cp.asarray(rng.standard_normal((9, 5003)).astype(dt))      # the row loop reuses shared memory 9 times
        pr = sm._prepare(x, -1, sm.OP_SOFTMAX, 'online', {'path': 'cluster', 'cluster': c, 'clusters': 1,
                                                          'copy': copy})
        y = cp.empty_like(x)
        sm._exec(pr, x, sm.OP_SOFTMAX, 'online', y=y)
cp.cuda.Device().synchronize()
print('child done')
"""


@gpu
def test_cluster_kernel_has_no_shared_memory_race():
    """compute-sanitizer racecheck on the cluster kernel, one cluster looping over rows (C = 1, 2, both copies):
    the block reduction's shared words are rewritten row after row with two barriers a row (block_state in
    softmax.cu), and the bulk copies rewrite the held part once every thread is past the previous row."""
    import shutil
    import subprocess
    import sys

    _needs_cluster()
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not on the PATH")
    r = subprocess.run([tool, "--tool", "racecheck", "--error-exitcode", "3", sys.executable, "-c", _RACECHECK_CHILD],
                       capture_output=True, text=True, timeout=140, cwd=Path(__file__).resolve().parent.parent)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "child done" in out, out[-3000:]
    assert "RACECHECK SUMMARY: 0 hazards" in out, out[-3000:]


@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_chosen_automatically(dtype, rng, cp):
    """On cc >= 9.0 the public functions take the cluster path for long rows (softmax, log_softmax)."""
    _needs_cluster()
    if sm.CLUSTER_ROW_BYTES is None:
        pytest.skip("the cluster path is switched off (CLUSTER_ROW_BYTES = None)")
    from cuflash import _compile

    sms = _compile.sm_count(cp.cuda.runtime.getDevice())
    n = sm.CLUSTER_ROW_BYTES[np.dtype(dtype).itemsize][0] // np.dtype(dtype).itemsize + 1
    x64 = rng.standard_normal((-(-sms // 2), n)) * 4
    xd = _to_device(x64, dtype)
    for op, f in ((sm.OP_SOFTMAX, scipy.special.softmax), (sm.OP_LOG_SOFTMAX, scipy.special.log_softmax)):
        y, pl = sm._softmax_impl(xd, -1, op, "online", None, return_plan=True)
        assert pl.path == "cluster", pl
        _check(y.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n, f.__name__)
    _, pl = sm._softmax_impl(xd, -1, sm.OP_SOFTMAX, "online", {"cluster": 0}, return_plan=True)
    assert pl.path != "cluster"
    # rows of just over 1 MiB on 9 rows: C = 16 on Hopper (non-portable, allowed by the wrapper), else the split
    cc = _compile.compute_capability(cp.cuda.runtime.getDevice())
    n = (1 << 20) // np.dtype(dtype).itemsize + 3
    x64 = rng.standard_normal((9, n)) * 4
    y, pl = sm._softmax_impl(_to_device(x64, dtype), -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
    assert (pl.path, pl.chunks) == ("cluster", 16) if int(cc) in sm.CLUSTER_NON_PORTABLE_CC else pl.path != "cluster"
    f = scipy.special.softmax
    _check(y.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n, "softmax")


@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cluster_blocks_share_the_row_statistics(dtype, rng, cp):
    """Every block of a cluster normalises with the same (m, l), bit for bit: a row made of C copies of one segment
    (each block reduces the same values) gives C bitwise-equal output segments. (The lanes of a warp can hold
    merged states 1 ulp apart, merge not being bitwise symmetric; a block sending each peer its own lane's copy
    fails this.)"""
    _needs_cluster()
    vec = 16 // np.dtype(dtype).itemsize
    cases = [({"path": "cluster", "cluster": c}, 300 * vec) for c in sm.CLUSTER_SIZES]
    cases += [({"path": "cluster", "cluster": c, "hold_bytes": 16 * 64}, 300 * vec) for c in (2, 8)]
    for part, seg in cases:
        c = part["cluster"]
        x64 = np.tile(rng.standard_normal((64, seg)) * 4, (1, c))
        for op in (sm.OP_SOFTMAX, sm.OP_LOG_SOFTMAX):
            y, pl = _cluster_run(_to_device(x64, dtype), op, part, cp)
            assert pl.slots_per_chunk * vec == seg, pl
            b = y.get().view(np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32).reshape(64, c, seg)
            assert (b == b[:, :1]).all(), (part, op)


def test_argument_errors_come_before_the_device():
    """Bad axes, methods, weights and states raise their documented errors before any device query or launch
    (scipy's: axis=True is a TypeError; logsumexp checks b's shape and the axis before converting anything)."""
    import cuflash

    x = _device_free_array((4, 6))
    with pytest.raises(ValueError, match="out of bounds"):
        cuflash.softmax(x, axis=2)
    with pytest.raises(TypeError, match="axis"):
        cuflash.softmax(x, axis=True)
    with pytest.raises(ValueError, match="method"):
        cuflash.log_softmax(x, method="bad")
    with pytest.raises(ValueError, match="out of bounds"):
        cuflash.logsumexp(x, axis=5, b=2.0)
    with pytest.raises(ValueError, match="broadcast"):
        cuflash.logsumexp(x, b=_device_free_array((4,)))
    with pytest.raises(TypeError, match="CuPy array"):
        cuflash.lse_from_state((np.zeros(3, np.float32), np.ones(3, np.float32)))
    with pytest.raises(TypeError, match="float32 or float64"):
        cuflash.lse_from_state((_device_free_array((3,), np.float16), _device_free_array((3,), np.float16)))
    with pytest.raises(ValueError, match="one shape"):
        cuflash.lse_from_state((x, _device_free_array((4, 7))))
    with pytest.raises(TypeError, match="pair"):
        cuflash.lse_from_state(x)
    with pytest.raises(TypeError, match="keepdims"):
        cuflash.logsumexp(x, axis=-1, keepdims="no")
    with pytest.raises(TypeError, match="return_sign"):
        cuflash.logsumexp(x, axis=-1, b=2.0, return_sign=2)


# ----------------------------------------------------------------------------------------------------------
# the held split (compute capability >= 9.0): chunks held in shared memory, a cooperative persistent grid
def test_held_plan(monkeypatch):
    vec = 4  # float32
    cfg = sm.HELD_CONFIG
    s = sm.HELD_THREADS * cfg[0]
    p = sm.plan(np.float32, 3, s * vec * 5 + 1, sms=SMS, cc=CC_H200, partition={"path": "held"})
    assert p.path == "held" and p.chunks == 6 and p.copy == cfg and 6 * p.slots_per_chunk >= 5 * s + 1
    p = sm.plan(np.float32, 3, 100, sms=SMS, cc=CC_H200, partition={"path": "held", "config": (6, 1, 2)})
    assert (p.path, p.chunks, p.slots_per_chunk, p.copy) == ("held", 1, 25, (6, 1, 2))
    assert sm._held_smem((8, 1, 1)) == 3 * 32 << 10 and sm._held_per_sm((8, 1, 1)) == 2
    assert sm._held_per_sm((4, 1, 1)) == 4 and sm._held_per_sm((6, 1, 2)) == 2
    # the longest row: K = resident blocks + 1 (the planner's estimate), one more chunk is refused
    k_max = sm._held_per_sm(cfg) * SMS + 1
    assert sm.plan(np.float32, 1, k_max * s * vec, sms=SMS, cc=CC_H200, partition={"path": "held"}).chunks == k_max
    with pytest.raises(ValueError, match="too long for the held path"):
        sm.plan(np.float32, 1, k_max * s * vec + 1, sms=SMS, cc=CC_H200, partition={"path": "held"})
    with pytest.raises(ValueError, match="softmax/log_softmax"):
        sm.plan(np.float64, 3, 100, sms=SMS, cc=CC_H200, partition={"path": "held"})
    with pytest.raises(ValueError, match="softmax/log_softmax"):
        sm.plan(np.float32, 3, 100, op=sm.OP_LSE, sms=SMS, cc=CC_H200, partition={"path": "held"})
    with pytest.raises(ValueError, match="softmax/log_softmax"):
        sm.plan(np.float32, 3, 100, method="safe", sms=SMS, cc=CC_H200, partition={"path": "held"})
    with pytest.raises(ValueError, match="config"):
        sm.plan(np.float32, 3, 100, sms=SMS, cc=CC_H200, partition={"path": "held", "config": (7, 1, 1)})
    from cuflash import _compile

    with pytest.raises(_compile.ConfigurationError, match="compute capability"):
        sm.plan(np.float32, 3, 100, sms=SMS, cc=80, partition={"path": "held"})
    # automatic: rows of HELD_ROW_BYTES and more with chunks for every resident block, softmax/log_softmax, cc 9.0
    assert sm.HELD_ROW_BYTES == 2 << 20 and sm.HELD_CC == (CC_H200,)
    for dt in DTYPES.values():
        n = sm.HELD_ROW_BYTES // np.dtype(dt).itemsize
        assert sm.plan(dt, 64, n, sms=SMS, cc=CC_H200) == ("held", 256, 256, 64, 2048, cfg)
        assert sm.plan(dt, 64, n, op=sm.OP_LOG_SOFTMAX, sms=SMS, cc=CC_H200).path == "held"
        assert sm.plan(dt, 64, 2 * n, sms=SMS, cc=CC_H200).path == "held"
        assert sm.plan(dt, 64, n - 1, sms=SMS, cc=CC_H200).path == "cluster"
        assert sm.plan(dt, 64, n, op=sm.OP_LSE, sms=SMS, cc=CC_H200).path != "held"
        assert sm.plan(dt, 64, n, method="safe", sms=SMS, cc=CC_H200).path == "stream"
        for cc in (None, 80, 100):
            assert sm.plan(dt, 64, n, sms=SMS, cc=cc).path != "held"
        assert sm.plan(dt, 64, n, sms=SMS, cc=CC_H200, partition={"held": 0}).path == "cluster"
        assert sm.plan(dt, 64, n, sms=SMS, cc=CC_H200, partition={"path": "cluster"}).path == "cluster"
        assert sm.plan(dt, 64, n, sms=SMS, cc=CC_H200, partition={"chunks": 9}).path == "split"
        assert sm.plan(dt, 4, n, sms=SMS, cc=CC_H200).path == "split"  # 4 x 64 chunks < 2 x 132 blocks
        assert sm.plan(dt, 5, n, sms=SMS, cc=CC_H200).path == "held"
        assert sm.plan(dt, 1, k_max * s * 16 // np.dtype(dt).itemsize + 16, sms=SMS, cc=CC_H200).path == "split"
    assert sm.plan(np.float64, 64, 1 << 20, sms=SMS, cc=CC_H200).path != "held"
    monkeypatch.setattr(sm, "HELD_ROW_BYTES", None)
    assert sm.plan(np.float32, 64, 1 << 20, sms=SMS, cc=CC_H200).path == "split"


def test_held_kernels_declared_for_sm90_only():
    from cuflash import _compile

    decl = {(n, e) for s, n, e, _ in _compile.declared() if s == sm.SOURCE and "softmax_hold" in n}
    assert decl == {(sm._held_name(_dtypes.CTYPE[dt], cfg), sm.CLUSTER_ARCH_OPTIONS) for dt in DTYPES.values()
                    for cfg in sm.HELD_CONFIGS}


def _held_run(x, op, part, cp, poison=0xFF):
    """One forced held launch on rows of x (last axis) into an output of ``poison`` bytes (_poisoned): the output
    (CuPy) and the prepared launch."""
    pr = sm._prepare(x, -1, op, "online", part)
    assert pr.plan.path == "held" and pr.plan.copy == tuple(part.get("config", sm.HELD_CONFIG)), pr.plan
    y = _poisoned(cp, x.shape, x.dtype, poison)
    sm._exec(pr, x, op, "online", y=y)
    return y, pr


def _held_compare(x64, dtype, part, cp, x_dev=None, poison=0xFF):
    xd = _to_device(x64, dtype) if x_dev is None else x_dev
    n = x64.shape[-1]
    for op, f in ((sm.OP_SOFTMAX, scipy.special.softmax), (sm.OP_LOG_SOFTMAX, scipy.special.log_softmax)):
        out, pr = _held_run(xd, op, part, cp, poison)
        _check(out.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n,
               f"{f.__name__} {pr.plan} grid {pr.grid}")
    return pr


@gpu
@pytest.mark.parametrize("cfg", sm.HELD_CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_held_chunk_boundaries_and_tails(dtype, cfg, rng, cp):
    """Row lengths around one and several chunks and the vector tails, rows starting inside a 16-byte slot."""
    _needs_cluster()
    vec = 16 // np.dtype(dtype).itemsize
    e = sm.HELD_THREADS * cfg[0] * vec  # elements of a whole chunk
    part = {"path": "held", "config": cfg}
    for n in sorted({1, 2, vec - 1, vec + 1, 3001, e - vec, e - 1, e, e + 1, e + vec, 2 * e - 1, 2 * e + 3,
                     7 * e + vec + 1, 40 * e - 5}):
        x64 = rng.standard_normal((3, n)) * 8  # odd n: rows 1 and 2 start inside a 16-byte slot
        _held_compare(x64, dtype, part, cp)
        # a view one element into a wider array: softmax copies it first (input and output rows must share their
        # offset in a 16-byte slot), so this checks that copy with the held launch
        wide = _to_device(np.concatenate([np.zeros((3, 1)), x64], axis=1), dtype)
        _held_compare(x64, dtype, part, cp, x_dev=wide[:, 1:])


@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_held_blocks_loop_and_longest_rows(dtype, rng, cp, monkeypatch):
    """More chunks than resident blocks (each block loops, rows cross its iterations), and rows of exactly
    resident blocks + 1 chunks (the longest the deadlock argument allows), then one chunk more: refused."""
    _needs_cluster()
    from cuflash import _compile

    vec = 16 // np.dtype(dtype).itemsize
    cfg = sm.HELD_CONFIG
    e = sm.HELD_THREADS * cfg[0] * vec
    for rows, n in ((2000, 5003), (701, 3 * e - 7), (37, 31 * e + 11), (9, 64 * e)):
        pr = _held_compare(rng.standard_normal((rows, n)) * 6, dtype, {"path": "held"}, cp)
        assert rows * pr.plan.chunks > pr.grid[0], (pr.plan, pr.grid)  # every block takes several chunks
    g = sm._residency(_compile.get_kernel(sm.SOURCE, sm._held_name(_dtypes.CTYPE[np.dtype(dtype)], cfg),
                                          sm.CLUSTER_ARCH_OPTIONS), sm.HELD_THREADS, sm._held_smem(cfg))
    x64 = rng.standard_normal((2, (g + 1) * e)) * 4
    x64[1, -3:] = 30.0  # the row's max in its last chunk
    pr = _held_compare(x64, dtype, {"path": "held"}, cp)
    assert pr.plan.chunks == g + 1 and pr.grid == (g,)
    # one chunk more than the driver's resident blocks allow, with the planner's estimate raised so that the plan
    # takes it: refused when forced; the automatic plan falls back to the split
    monkeypatch.setattr(sm, "HELD_SMEM_PER_SM", 4 * sm.HELD_SMEM_PER_SM)
    monkeypatch.setattr(sm, "HELD_ROW_BYTES", 1 << 20)
    xl = _to_device(rng.standard_normal((4, (g + 1) * e + 1)), dtype)  # K = g + 2; 4 rows: chunks for every block
    with pytest.raises(_compile.ConfigurationError, match="resident"):
        sm._softmax_impl(xl, -1, sm.OP_SOFTMAX, "online", {"path": "held"})
    assert sm.plan(xl.dtype, 4, xl.shape[1], sms=_compile.sm_count(cp.cuda.runtime.getDevice()), cc=90).path == "held"
    y, pl = sm._softmax_impl(xl, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
    assert pl.path == "split", pl
    np.testing.assert_allclose(y.sum(axis=1, dtype=cp.float32).get(), 1.0, rtol=1e-2)


@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_held_edge_values_match_scipy(dtype, rng, cp):
    """-inf rows and chunks, +inf, NaN, huge values and all-equal rows spread over the chunks; 16-bit rows whose
    max sits on either side of the fast exponent's threshold (|m| = 1024)."""
    _needs_cluster()
    for cfg in sm.HELD_CONFIGS:
        for n in (64, 3001, 40001, 300001):
            _held_compare(_edge_rows(n, dtype), dtype, {"path": "held", "config": cfg}, cp)
        # rows whose right answer is NaN must be written: a finite poison shows a skipped chunk there
        _held_compare(_edge_rows(40001, dtype), dtype, {"path": "held", "config": cfg}, cp, poison=0x3C)
    n = 20000
    offsets = np.array([-3072.0, -1032.0, -1024.0, -1016.0, 0.0, 1016.0, 1024.0, 1032.0, 8192.0])
    x64 = rng.standard_normal((len(offsets), n)) * 6
    x64 -= x64.max(axis=1, keepdims=True)
    x64 = (x64 + offsets[:, None]).astype(dtype).astype(np.float64)
    _held_compare(x64, dtype, {"path": "held"}, cp)


@gpu
def test_held_is_deterministic(rng, cp):
    x = _to_device(rng.standard_normal((5, 300001)), np.float32)
    _needs_cluster()
    a, _ = _held_run(x, sm.OP_SOFTMAX, {"path": "held"}, cp)
    b, _ = _held_run(x, sm.OP_SOFTMAX, {"path": "held"}, cp)
    assert bool((a == b).all())


@gpu
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_held_through_the_public_functions_on_a_side_stream(dtype, rng, cp):
    """cuflash.softmax / log_softmax on rows of HELD_ROW_BYTES take the held path by themselves (cc 9.0), and run on
    the current stream: launched on a non-blocking stream, the result is read after that stream's synchronize."""
    _needs_cluster()
    import cuflash

    n = sm.HELD_ROW_BYTES // np.dtype(dtype).itemsize
    x64 = rng.standard_normal((6, n)) * 6
    x64[3, n - 2] = 50.0  # the row's max in its last chunk
    x = _to_device(x64, dtype)
    assert sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None).plan.path == "held"
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()  # x was made on the default stream, which a non-blocking stream does not wait for
    with s:
        y = cuflash.softmax(x, axis=-1)
        ly = cuflash.log_softmax(x, axis=-1)
    s.synchronize()
    for out, f in ((y, scipy.special.softmax), (ly, scipy.special.log_softmax)):
        _check(out.get(), _ref(f, x64, dtype, axis=-1), _baseline(f, x64, dtype, axis=-1), dtype, n,
               f"{f.__name__} held public")
