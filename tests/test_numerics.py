"""cuflash.numerics: format constants (against finfo and against brute-force enumeration of bit patterns), the
NumPy precision emulation behind the numerics experiments, and the partitioned GPU reduction.
"""

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from cuflash import numerics

ALL = list(numerics.FORMATS) + ["float64"]


def _finfo(dt):
    dt = np.dtype(dt)
    return np.finfo(dt) if dt in (np.float16, np.float32, np.float64) else ml_dtypes.finfo(dt)


@pytest.mark.parametrize("name", ALL)
def test_format_constants_match_finfo(name):
    dt = np.dtype(np.float64) if name == "float64" else numerics.FORMATS[name]
    info, fi = numerics.format_info(dt), _finfo(dt)
    print(info)
    assert info["bits"] == fi.bits == dt.itemsize * 8
    assert info["mantissa_bits"] == fi.nmant
    assert info["exponent_bits"] == fi.nexp
    assert info["max"] == float(fi.max)
    assert info["smallest_normal"] == float(fi.smallest_normal)
    assert info["smallest_subnormal"] == float(fi.smallest_subnormal)
    assert info["eps"] == float(fi.eps)
    assert info["unit_roundoff"] == float(fi.eps) / 2
    # finfo.precision is floor(-log10 eps); ml_dtypes reports 1 for the float8 formats
    assert int(-np.log10(info["eps"])) == fi.precision or name.startswith("float8")
    assert info["decimal_digits"] == pytest.approx(info["precision_bits"] * np.log10(2))
    assert info["has_inf"] == (name != "float8_e4m3fn")


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_format_constants_by_enumerating_every_bit_pattern(name):
    dt = numerics.FORMATS[name]
    bits = np.arange(2 ** (8 * dt.itemsize), dtype=np.uint64).astype(np.uint16 if dt.itemsize == 2 else np.uint8)
    with np.errstate(invalid="ignore"):
        v = bits.view(dt).astype(np.float64)
    fin = v[np.isfinite(v)]
    pos = fin[fin > 0]
    info = numerics.format_info(dt)
    ebits = info["exponent_bits"]
    mbits = info["mantissa_bits"]
    exp_field = (bits.astype(np.int64) >> mbits) & ((1 << ebits) - 1)
    normal = np.isfinite(v) & (v > 0) & (exp_field > 0)
    assert info["max"] == pos.max()
    assert info["smallest_subnormal"] == pos.min()
    assert info["smallest_normal"] == v[normal].min()
    assert info["eps"] == np.sort(pos[pos > 1.0])[0] - 1.0
    assert info["has_inf"] == bool(np.isinf(v).any())


def test_format_info_rejects_unknown():
    with pytest.raises(TypeError):
        numerics.format_info(np.int32)


def test_round_to_and_sequential_sum_stagnation():
    assert numerics.round_to(1.0 + 2 ** -11, np.float16) == 1.0  # half an ulp: ties to even
    assert numerics.round_to(1.0 + 3 * 2 ** -11, np.float16) == 1.0 + 2 ** -9
    assert numerics.round_to(70000.0, np.float16) == np.inf
    # float16 sequential sum of ones stops at 2048 (2049 is not representable, 2048 + 1 ties to 2048)
    s = numerics.sequential_sum(np.ones((2, 3000)), np.float16)
    assert np.all(s == 2048)
    assert np.all(numerics.sequential_sum(np.ones((2, 3000)), np.float32) == 3000)


def test_variance_methods_on_large_mean(rng):
    """Sum/sum-of-squares cancels when the mean is large against the spread; two-pass and Welford do not."""
    x = (rng.standard_normal((8, 1024)) + 1e4).astype(np.float32)
    ref = x.astype(np.float64).var(axis=1)
    err = {m: np.abs(numerics.variance(x, m, np.float32) / ref - 1).max() for m in ("sumsq", "two_pass", "welford")}
    print(err)
    assert err["sumsq"] > 1e-1
    assert err["two_pass"] < 1e-3 and err["welford"] < 1e-2  # Welford: ~n u kappa, two-pass: ~n u + (n u kappa)^2
    # the handed case ln-large-mean: float32 row [40000, 40001, 40002, 40003] has variance 1.25
    row = np.array([[40000.0, 40001.0, 40002.0, 40003.0]], np.float32)
    assert numerics.variance(row, "welford")[0] == pytest.approx(1.25, rel=1e-6)
    assert numerics.variance(row, "two_pass")[0] == pytest.approx(1.25, rel=1e-6)
    with pytest.raises(ValueError):
        numerics.variance(row, "bogus")


def test_softmax_emulation_overflow_points(rng):
    x = rng.uniform(-1, 1, (4, 64))
    x[:, 7] = 1.0
    for dt, bad_at, ok_at in [(np.float16, 12.0, 10.0), (np.float32, 90.0, 80.0),
                              (ml_dtypes.bfloat16, 90.0, 80.0)]:
        # the reference of the input the emulation sees (x * bad_at rounded to dt): rounding an input of ~90 to
        # float32 moves exp by up to ulp(90)/2 ~ 4e-6 relative, more than the 8-eps bound on the algorithm
        ref = scipy.special.softmax((x * bad_at).astype(dt).astype(np.float64), axis=1)
        naive = numerics.softmax_emulated(x * bad_at, "naive", dt)
        assert not np.isfinite(naive).all(), dt
        assert np.isfinite(numerics.softmax_emulated(x * ok_at, "naive", dt)).all(), dt
        for m in ("safe", "online"):
            y = numerics.softmax_emulated(x * bad_at, m, dt)
            err = np.abs(y - ref).max()
            print(dt, m, err)
            assert err < 8 * numerics.format_info(dt)["eps"]
    # float8 e4m3fn has no infinity: overflow shows up as NaN
    assert np.isnan(numerics.softmax_emulated(x * 8, "naive", ml_dtypes.float8_e4m3fn)).any()
    with pytest.raises(ValueError):
        numerics.softmax_emulated(x, "bogus", np.float32)


# ----------------------------------------------------------------------------------------------------------
# GPU: partitioned reduction
PARTITIONS = [dict(ept=1, threads=32, blocks_per_row=1, tree="sequential"),
              dict(ept=1, threads=256, blocks_per_row=1, tree="butterfly"),
              dict(ept=4, threads=128, blocks_per_row=3, tree="butterfly"),
              dict(ept=8, threads=1024, blocks_per_row=7, tree="sequential"),
              dict(ept=16, threads=64, blocks_per_row=32, tree="butterfly"),
              dict(ept=3, threads=96, blocks_per_row=5, tree="sequential")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
def test_partitioned_reduce_within_bound_and_order_dependent(cp, rng, dtype):
    rows, n = 6, 100003
    h = (rng.standard_normal((rows, n)) * 3 + 0.5).astype(np.float32).astype(dtype)
    x = cp.asarray(h)
    ref_sum = h.astype(np.float64).sum(axis=1)
    ref_lse = scipy.special.logsumexp(h.astype(np.float64), axis=1)
    cond = np.abs(h.astype(np.float64)).sum(axis=1) / np.abs(ref_sum)
    u = 2.0 ** -24
    sums, lses = [], []
    for p in PARTITIONS:
        s = numerics.partitioned_reduce(x, "sum", **p).get()
        l = numerics.partitioned_reduce(x, "logsumexp", **p).get()
        rel = np.abs(s - ref_sum) / np.abs(ref_sum)
        lerr = np.abs(l - ref_lse)
        print(p, "sum rel err", rel.max(), "bound", (n * u * cond).min(), "lse abs err", lerr.max())
        assert np.all(rel <= n * u * cond), p
        assert np.all(lerr <= (n + 8) * u + 8 * u * np.abs(ref_lse)), p
        again = numerics.partitioned_reduce(x, "sum", **p).get()
        assert np.array_equal(s.view(np.uint32), again.view(np.uint32)), "not deterministic for a fixed partition"
        sums.append(s)
        lses.append(l)
    distinct = {tuple(s.view(np.uint32)) for s in sums}
    print("distinct bit patterns of the row sums over", len(sums), "partitions:", len(distinct))
    assert len(distinct) > 1


@pytest.mark.gpu
def test_partitioned_reduce_edges(cp):
    inf = np.inf
    h = np.array([[-inf, -inf, -inf, -inf, -inf], [1.0, -inf, 2.0, -inf, 3.0]], np.float32)
    x = cp.asarray(h)
    for p in PARTITIONS:  # blocks_per_row > n gives empty segments: identity states
        l = numerics.partitioned_reduce(x, "logsumexp", **p).get()
        assert l[0] == -inf and l[1] == pytest.approx(scipy.special.logsumexp([1.0, 2.0, 3.0]), rel=1e-6)
        s = numerics.partitioned_reduce(cp.asarray(np.array([[2.5]], np.float32)), "sum", **p).get()
        assert s[0] == 2.5
    with pytest.raises(ValueError):
        numerics.partitioned_reduce(x, "sum", threads=48)
    with pytest.raises(ValueError):
        numerics.partitioned_reduce(x, "max")
    with pytest.raises(TypeError):
        numerics.partitioned_reduce(h, "sum")
