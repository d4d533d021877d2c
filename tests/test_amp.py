"""cuflash.amp: the loss-scaler policy (CPU), multi-tensor unscale_and_check and the fused optimizer steps (GPU).

GPU tests compare against float64 NumPy references and print the kernel's error next to a float32 NumPy
baseline's before asserting (kernel error <= 2x baseline + a small floor); the model copy must equal the
master rounded to its dtype bit for bit, and every element of it must be written (poisoned first).
"""
import ml_dtypes
import numpy as np
import pytest

from conftest import poison
from cuflash import amp

BF16 = np.dtype(ml_dtypes.bfloat16)
GRAD_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
SIZES = [1, 3, 1023, 4097, 70001, 5]  # irregular; the last tensor is odd-sized


# ----------------------------------------------------------------------------------------------------------
# CPU: scaler policy, validation
def test_scaler_defaults():
    s = amp.DynamicLossScaler()
    assert s.scale == 65536.0 and s.growth_factor == 2.0 and s.backoff_factor == 0.5
    assert s.growth_interval == 2000 and s.inv_scale == 1.0 / 65536.0


def test_scaler_scripted_pattern():
    """growth_interval=3: clean steps count up, an overflow halves the scale and resets the count."""
    s = amp.DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    pattern = [0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1]
    # scale AFTER each update, worked out by hand
    expect = [1024, 1024, 2048, 2048, 1024, 1024, 1024, 512, 256, 256, 256, 512, 512, 512, 1024, 512]
    applied = []
    for f, e in zip(pattern, expect):
        applied.append(s.update(bool(f)))
        assert s.scale == e, (pattern, [h[0] for h in s.history], s.scale, e)
    assert applied == [not f for f in pattern]
    assert [h[1] for h in s.history] == [bool(f) for f in pattern]
    assert s.history[0][0] == 1024 and s.history[3][0] == 2048  # scale used at each step


def test_scaler_default_growth_after_2000_clean_steps():
    s = amp.DynamicLossScaler()
    for i in range(1999):
        s.update(0)
    assert s.scale == 2.0 ** 16
    s.update(0)
    assert s.scale == 2.0 ** 17
    s.update(1)
    assert s.scale == 2.0 ** 16 and s.growth_tracker == 0


def test_scaler_custom_factors_and_clamp():
    s = amp.DynamicLossScaler(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=1,
                              min_scale=1.0, max_scale=64.0)
    seq = []
    for f in [0, 0, 0, 1, 1, 1, 0]:
        s.update(f)
        seq.append(s.scale)
    assert seq == [32.0, 64.0, 64.0, 16.0, 4.0, 1.0, 4.0]


@pytest.mark.parametrize("kw", [dict(init_scale=0), dict(init_scale=float("inf")), dict(growth_factor=1.0),
                                dict(backoff_factor=1.0), dict(backoff_factor=0.0), dict(growth_interval=0)])
def test_scaler_rejects_bad_parameters(kw):
    with pytest.raises(ValueError):
        amp.DynamicLossScaler(**kw)


@pytest.mark.parametrize("kw,exc", [
    (dict(growth_interval="10"), TypeError), (dict(growth_interval=2.5), TypeError),
    (dict(growth_interval=True), TypeError), (dict(init_scale="1"), TypeError), (dict(growth_factor=None), TypeError),
    (dict(growth_factor=float("inf")), ValueError), (dict(min_scale=float("nan")), ValueError),
    (dict(max_scale=0.0), ValueError), (dict(min_scale=4.0, max_scale=2.0), ValueError)])
def test_scaler_arguments_named_in_errors(kw, exc):
    with pytest.raises(exc, match=next(iter(kw))):
        amp.DynamicLossScaler(**kw)


def test_scaler_clamps_init_scale_and_takes_one_element_flags():
    assert amp.DynamicLossScaler(init_scale=2.0 ** 20, max_scale=2.0 ** 10).scale == 2.0 ** 10
    assert amp.DynamicLossScaler(init_scale=1.0, min_scale=8.0).scale == 8.0

    class Flag:  # a device flag of shape (1,) or (1, 1), as unscale_and_check accepts for found_inf
        def __init__(self, v, shape):
            self.v = np.full(shape, v, np.int32)

        def get(self):
            return self.v

    s = amp.DynamicLossScaler(init_scale=4.0, growth_interval=10)
    assert s.update(Flag(0, (1,))) and not s.update(Flag(1, (1, 1))) and s.scale == 2.0
    assert not s.update(np.array([1])) and s.scale == 1.0
    with pytest.raises(ValueError, match="one element"):
        s.update(np.zeros(2, np.int32))

    class TorchLike:  # a tensor on the device: no .get(), .cpu() gives host data
        def cpu(self):
            return np.ones((1,), np.int32)

    assert not s.update(TorchLike()) and s.scale == 0.5


def test_scaler_growth_stops_where_inv_scale_stays_normal():
    """torch stops growing where the float32 scale would overflow; here at 2^126, so that 1 / scale stays a normal
    float32 (the kernels flush subnormals, and a subnormal inv_scale would zero every gradient silently)."""
    s = amp.DynamicLossScaler(init_scale=2.0 ** 125, growth_interval=1)
    for _ in range(3):
        assert s.update(0)
    assert s.scale == 2.0 ** 126 and np.float32(s.inv_scale) == np.finfo(np.float32).tiny
    with pytest.raises(ValueError, match="smallest normal"):
        amp.unscale_and_check([], 1e-39)
    with pytest.raises(ValueError, match="smallest normal"):
        amp.sgd_momentum_step(None, None, None, lr=0.1, inv_scale=2.0 ** -127)
    with pytest.raises(ValueError, match="smallest normal"):
        amp.adamw_step(None, None, None, None, lr=0.1, step=1, inv_scale=-1e-40)


def test_scaler_state_dict_roundtrip():
    s = amp.DynamicLossScaler(growth_interval=5)
    s.update(0)
    s.update(1)
    s.update(0)
    t = amp.DynamicLossScaler(growth_interval=5)
    t.load_state_dict(s.state_dict())
    assert (t.scale, t.growth_tracker) == (s.scale, s.growth_tracker) == (32768.0, 1)
    u = amp.DynamicLossScaler()  # the settings travel too (as torch.amp.GradScaler's state_dict)
    u.load_state_dict(s.state_dict())
    assert (u.growth_interval, u.growth_factor, u.backoff_factor) == (5, 2.0, 0.5)


def test_bias_corrections():
    bc1, bc2s = amp.adamw_bias_corrections(3, (0.9, 0.999))
    assert bc1 == pytest.approx(1 - 0.9 ** 3, rel=1e-15) and bc2s == pytest.approx((1 - 0.999 ** 3) ** 0.5, rel=1e-15)
    with pytest.raises(ValueError):
        amp.adamw_bias_corrections(0)


@pytest.mark.parametrize("call,exc,match", [
    # torch.optim's range checks and non-numbers, caught before the arrays are even looked at (so no GPU needed)
    (lambda a: amp.unscale_and_check(a[:1], None), TypeError, "inv_scale"),
    (lambda a: amp.unscale_and_check(a[:1], float("nan")), ValueError, "inv_scale"),
    (lambda a: amp.unscale_and_check(a[:1], 1e39), ValueError, "inv_scale"),
    (lambda a: amp.unscale_and_check(a[:1], "0.5"), TypeError, "inv_scale"),
    (lambda a: amp.unscale_and_check(a[:1], 0.5, write="no"), TypeError, "write"),
    (lambda a: amp.sgd_momentum_step(*a, lr=None), TypeError, "lr"),
    (lambda a: amp.sgd_momentum_step(*a, lr=-0.1), ValueError, "lr"),
    (lambda a: amp.sgd_momentum_step(*a, lr=0.1, momentum=-0.9), ValueError, "momentum"),
    (lambda a: amp.sgd_momentum_step(*a, lr=0.1, weight_decay=-1e-2), ValueError, "weight_decay"),
    (lambda a: amp.sgd_momentum_step(*a, lr=0.1, inv_scale=float("inf")), ValueError, "inv_scale"),
    (lambda a: amp.sgd_momentum_step(*a, lr=0.1, nesterov="yes"), TypeError, "nesterov"),
    (lambda a: amp.sgd_momentum_step(*a, lr=0.1, momentum=0.0, nesterov=True), ValueError, "Nesterov"),
    (lambda a: amp.adamw_step(*a, a[0], lr=None, step=1), TypeError, "lr"),
    (lambda a: amp.adamw_step(*a, a[0], lr=1e-3, step=1, eps=-1e-8), ValueError, "eps"),
    (lambda a: amp.adamw_step(*a, a[0], lr=1e-3, step=1, betas=(1.0, 0.999)), ValueError, "betas"),
    (lambda a: amp.adamw_step(*a, a[0], lr=1e-3, step=1, betas=(0.9, -0.1)), ValueError, "betas"),
    (lambda a: amp.adamw_step(*a, a[0], lr=1e-3, step=1, betas=0.9), TypeError, "betas"),
    (lambda a: amp.adamw_step(*a, a[0], lr=1e-3, step=1.5), TypeError, "step"),
    (lambda a: amp.adamw_step(*a, a[0], lr=1e-3, step=0), ValueError, "step"),
    (lambda a: amp.adamw_step(*a, a[0], lr=1e-3, step=1, weight_decay=float("nan")), ValueError, "weight_decay"),
])
def test_bad_hyperparameters_raise_before_launch(call, exc, match):
    a = [np.ones(3, np.float32) for _ in range(3)]  # host arrays: the scalar errors come first
    with pytest.raises(exc, match=match):
        call(a)


def test_host_arrays_are_rejected():
    with pytest.raises(TypeError, match="CuPy"):
        amp.unscale_and_check([np.ones(3, np.float32)], 0.5)
    with pytest.raises(TypeError, match="CuPy"):
        amp.sgd_momentum_step(np.ones(3, np.float32), np.ones(3, np.float32), np.ones(3, np.float32), lr=0.1)


# ----------------------------------------------------------------------------------------------------------
# GPU: unscale_and_check
def _grads(cp, rng, dtype, sizes=SIZES, scale=1000.0):
    host = [(rng.standard_normal(n) * scale).astype(np.float32).astype(dtype) for n in sizes]
    return host, [cp.asarray(h) for h in host]


def _unscaled_ref(h, inv):
    return (h.astype(np.float32) * np.float32(inv)).astype(h.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_unscale_clean_list(cp, rng, dtype):
    host, dev = _grads(cp, rng, dtype)
    inv = 1.0 / 3000.0
    flag = amp.unscale_and_check(dev, inv)
    assert isinstance(flag, cp.ndarray) and flag.dtype == np.int32 and flag.shape == ()
    assert int(flag) == 0
    for h, d in zip(host, dev):
        out, ref = d.get(), _unscaled_ref(h, inv)
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        print(f"{dtype} n={h.size}: max diff {diff.max():.3g} (exact expected)")
        assert np.array_equal(out.view(np.uint8), ref.view(np.uint8)), f"n={h.size}"


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_unscale_finds_single_nonfinite_anywhere(cp, rng, dtype, bad):
    """One inf/NaN at the first, a middle or the last element of any tensor of the list is found."""
    for t, n in enumerate(SIZES):
        for pos in sorted({0, n // 2, n - 1}):
            host = [(rng.standard_normal(m)).astype(np.float32).astype(dtype) for m in SIZES]
            host[t][pos] = bad  # injected on the host: no device-side bfloat16 setitem needed
            dev = [cp.asarray(h) for h in host]
            flag = amp.unscale_and_check(dev, 0.5)
            assert int(flag) == 1, f"tensor {t} (n={n}) position {pos} ({bad}) not found"
            # the other elements are still unscaled (torch semantics: unscale happens regardless)
            other = dev[(t + 1) % len(SIZES)].get()
            assert np.array_equal(other.view(np.uint8), _unscaled_ref(host[(t + 1) % len(SIZES)], 0.5).view(np.uint8))


@pytest.mark.gpu
def test_unscale_large_tensor_last_element_and_mixed_dtypes(cp, rng):
    """A tensor larger than one grid pass (grid-stride + unrolled path) with an inf in its last element, in a
    list that mixes float32, float16 and bfloat16 (one launch per dtype, one flag)."""
    n = (1 << 23) + 7
    big = cp.asarray(rng.standard_normal(n).astype(np.float32))
    small16 = cp.asarray(rng.standard_normal(33).astype(np.float16))
    hbf = rng.standard_normal(17).astype(np.float32).astype(BF16)
    small_bf = cp.asarray(hbf)
    assert int(amp.unscale_and_check([big, small16, small_bf], 1.0)) == 0
    big[-1] = np.inf
    assert int(amp.unscale_and_check([small16, big, small_bf], 1.0)) == 1
    big[-1] = 0.5
    hbf[-1] = np.nan
    small_bf = cp.asarray(hbf)
    assert int(amp.unscale_and_check([small16, big, small_bf], 1.0)) == 1
    assert int(amp.unscale_and_check([big, small16], 1.0)) == 0


@pytest.mark.gpu
def test_unscale_accumulates_into_given_flag_and_check_finite_does_not_write(cp, rng):
    host, dev = _grads(cp, rng, np.float32)
    flag = cp.ones((), dtype=np.int32)
    out = amp.unscale_and_check(dev, 0.25, found_inf=flag)
    assert out is flag and int(flag) == 1  # OR semantics: a set flag stays set
    before = [d.get() for d in dev]
    f2 = amp.check_finite(dev)
    assert int(f2) == 0
    for b, d in zip(before, dev):
        assert np.array_equal(b, d.get())
    dev[2][5] = np.nan
    assert int(amp.check_finite(dev)) == 1
    assert int(amp.unscale_and_check([], 0.5)) == 0
    assert int(amp.unscale_and_check([cp.empty(0, np.float16)], 0.5)) == 0


@pytest.mark.gpu
def test_unscale_rejects_bad_input(cp):
    with pytest.raises(TypeError):
        amp.unscale_and_check([cp.ones(3, np.int32)], 0.5)
    with pytest.raises(ValueError):
        amp.unscale_and_check([cp.ones((4, 4), np.float32)[:, ::2]], 0.5)
    with pytest.raises(ValueError):
        amp.unscale_and_check([cp.ones(3, np.float32)], 0.5, found_inf=cp.zeros(2, np.int32))


# ----------------------------------------------------------------------------------------------------------
# GPU: fused optimizer steps
def _nan_array(cp, n, dtype):
    """A poisoned (all-NaN) output made on the host (no device fill kernel needed for bfloat16)."""
    return cp.asarray(np.full(n, np.nan, dtype=np.float32).astype(dtype))


def _sgd_ref(p, g, buf, lr, momentum, dampening, wd, nesterov, first, inv, ft):
    g = g.astype(ft) * ft(inv) + ft(wd) * p
    if momentum:
        buf = g.copy() if first else ft(momentum) * buf + ft(1 - dampening) * g
        g = g + ft(momentum) * buf if nesterov else buf
    return (p - ft(lr) * g).astype(ft), buf.astype(ft)


SGD_CONFIGS = [dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False),
               dict(momentum=0.9, dampening=0.0, weight_decay=1e-2, nesterov=True),
               dict(momentum=0.8, dampening=0.1, weight_decay=5e-3, nesterov=False),
               dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(SGD_CONFIGS)))
@pytest.mark.parametrize("gdt", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("mdt", [np.dtype(np.float16), BF16, None], ids=str)
def test_sgd_momentum_matches_float64(cp, rng, cfg, gdt, mdt):
    c = SGD_CONFIGS[cfg]
    n, lr, inv = 70001, 0.05, 1.0 / 1024.0
    p0 = rng.standard_normal(n).astype(np.float32)
    master = cp.asarray(p0)
    buf = cp.asarray(rng.standard_normal(n).astype(np.float32))  # overwritten on the first step
    model = _nan_array(cp, n, mdt) if mdt is not None else None
    p64, b64 = p0.astype(np.float64), np.zeros(n)
    p32, b32 = p0.copy(), np.zeros(n, np.float32)
    for step in range(4):
        g = (rng.standard_normal(n) * 1024.0).astype(np.float32).astype(gdt)
        amp.sgd_momentum_step(master, cp.asarray(g), buf, model, lr=lr, first_step=step == 0, inv_scale=inv, **c)
        args = (lr, c["momentum"], c["dampening"], c["weight_decay"], c["nesterov"], step == 0, inv)
        p64, b64 = _sgd_ref(p64, g, b64, *args, np.float64)
        p32, b32 = _sgd_ref(p32, g, b32, *args, np.float32)
        if mdt is not None and step < 3:
            model = _nan_array(cp, n, mdt)  # every element must be rewritten by the next step
    out = master.get().astype(np.float64)
    err, base = np.abs(out - p64).max(), np.abs(p32.astype(np.float64) - p64).max()
    berr = np.abs(buf.get() - b64).max() if c["momentum"] else 0.0
    print(f"sgd {c} g={gdt} model={mdt}: master max err {err:.3g} (fp32 numpy {base:.3g}), "
          f"mean {np.abs(out - p64).mean():.3g}; momentum err {berr:.3g}")
    assert err <= 2 * base + 1e-6
    if c["momentum"]:
        assert berr <= 1e-4 * np.abs(b64).max()
    if mdt is not None:
        m = model.get()
        assert np.array_equal(m.view(np.uint8), master.get().astype(mdt).view(np.uint8)), "model != round(master)"


def _adamw_ref(p, m, v, g, lr, b1, b2, eps, wd, step, inv, ft):
    g = g.astype(ft) * ft(inv)
    p = p * ft(1 - lr * wd)
    m = ft(b1) * m + ft(1 - b1) * g
    v = ft(b2) * v + ft(1 - b2) * g * g
    bc1, bc2s = 1 - b1 ** step, np.sqrt(1 - b2 ** step)
    p = p - ft(lr / bc1) * (m / (np.sqrt(v) / ft(bc2s) + ft(eps)))
    return p.astype(ft), m.astype(ft), v.astype(ft)


@pytest.mark.gpu
@pytest.mark.parametrize("gdt", GRAD_DTYPES, ids=str)
@pytest.mark.parametrize("mdt", [np.dtype(np.float16), BF16, None], ids=str)
def test_adamw_matches_float64(cp, rng, gdt, mdt):
    n, lr, b1, b2, eps, wd, inv = 4097, 1e-2, 0.9, 0.999, 1e-8, 1e-2, 1.0 / 256.0
    p0 = rng.standard_normal(n).astype(np.float32)
    master = cp.asarray(p0)
    ea, eas = cp.zeros(n, np.float32), cp.zeros(n, np.float32)
    model = _nan_array(cp, n, mdt) if mdt is not None else None
    r64 = (p0.astype(np.float64), np.zeros(n), np.zeros(n))
    r32 = (p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32))
    for step in range(1, 6):
        g = (rng.standard_normal(n) * 256.0 * rng.choice([1e-3, 1.0, 10.0], n)).astype(np.float32).astype(gdt)
        amp.adamw_step(master, cp.asarray(g), ea, eas, model, lr=lr, step=step, betas=(b1, b2), eps=eps,
                       weight_decay=wd, inv_scale=inv)
        r64 = _adamw_ref(*r64, g, lr, b1, b2, eps, wd, step, inv, np.float64)
        r32 = _adamw_ref(*r32, g, lr, b1, b2, eps, wd, step, inv, np.float32)
    out = master.get().astype(np.float64)
    err, base = np.abs(out - r64[0]).max(), np.abs(r32[0].astype(np.float64) - r64[0]).max()
    merr = np.abs(ea.get() - r64[1]).max() / np.abs(r64[1]).max()
    verr = np.abs(eas.get() - r64[2]).max() / np.abs(r64[2]).max()
    print(f"adamw g={gdt} model={mdt}: master max err {err:.3g} (fp32 numpy {base:.3g}); "
          f"moments rel err {merr:.3g} {verr:.3g}")
    assert err <= 2 * base + 1e-6
    assert merr < 1e-5 and verr < 1e-5
    if mdt is not None:
        assert np.array_equal(model.get().view(np.uint8), master.get().astype(mdt).view(np.uint8))


@pytest.mark.gpu
def test_optimizer_steps_skip_on_device_flag(cp, rng):
    n = 1000
    master = cp.asarray(rng.standard_normal(n).astype(np.float32))
    before = master.get()
    g = cp.asarray(rng.standard_normal(n).astype(np.float16))
    buf, ea, eas = cp.zeros(n, np.float32), cp.zeros(n, np.float32), cp.zeros(n, np.float32)
    model = poison(cp.empty(n, np.float16))
    flag = cp.ones((), np.int32)
    amp.sgd_momentum_step(master, g, buf, model, lr=0.1, found_inf=flag)
    amp.adamw_step(master, g, ea, eas, model, lr=0.1, step=1, found_inf=flag)
    assert np.array_equal(master.get(), before) and bool(cp.isnan(model).all())
    flag.fill(0)
    amp.sgd_momentum_step(master, g, buf, model, lr=0.1, found_inf=flag)
    assert not np.array_equal(master.get(), before) and not bool(cp.isnan(model).any())


@pytest.mark.gpu
def test_optimizer_rejects_bad_input(cp):
    m = cp.zeros(8, np.float32)
    with pytest.raises(TypeError):
        amp.sgd_momentum_step(m.astype(np.float16), m, m, lr=0.1)  # master must be float32
    with pytest.raises(ValueError):
        amp.sgd_momentum_step(m, cp.zeros(9, np.float32), m, lr=0.1)
    with pytest.raises(TypeError):
        amp.adamw_step(m, m, m.astype(np.float16), m, lr=0.1, step=1)
    with pytest.raises(ValueError):
        amp.adamw_step(m, m, m, m, lr=0.1, step=0)


@pytest.mark.gpu
def test_shared_memory_between_arrays_is_rejected(cp):
    """Every array must be its own buffer: the kernels update each element from one thread and take __restrict__
    pointers, so the same gradient twice was scaled twice, and a buffer passed as two states lost one update."""
    g = cp.ones(64, np.float32)
    with pytest.raises(ValueError, match="share memory"):
        amp.unscale_and_check([g, g], 0.5)
    with pytest.raises(ValueError, match="share memory"):
        amp.unscale_and_check([g[:40], g[32:]], 0.5)  # overlapping views
    amp.unscale_and_check([g[:32], g[32:]], 0.5)  # adjacent, disjoint: fine
    m = cp.zeros(8, np.float32)
    with pytest.raises(ValueError, match="share memory"):
        amp.sgd_momentum_step(m, cp.ones(8, np.float32), m, lr=0.1)
    # the master itself as the float32 model (no separate copy) is the one sharing allowed: as model=None
    g, buf = cp.ones(8, np.float32), cp.zeros(8, np.float32)
    amp.sgd_momentum_step(m, g, buf, m, lr=0.1, first_step=True)
    assert bool((m == -0.1).all())
    with pytest.raises(ValueError, match="share memory"):
        st = cp.zeros(8, np.float32)
        amp.adamw_step(m, cp.ones(8, np.float32), st, st, lr=0.1, step=1)


@pytest.mark.gpu
def test_unscale_table_on_another_stream(cp):
    """A cached pointer table used from another stream waits for its copy (an event, no host sync); many lists
    (more than the cache holds) on a busy stream all come out scaled once."""
    lists = [[cp.full(n, 2.0 ** (i % 7), np.float32) for n in (3, 1000 + i)] for i in range(amp._TABLES_MAX + 16)]
    busy = cp.cuda.Stream(non_blocking=True)
    other = cp.cuda.Stream(non_blocking=True)
    big = cp.ones((4096, 4096), np.float32)
    cp.cuda.Device().synchronize()  # the inputs, made on the legacy stream, before the non-blocking ones start
    with busy:
        for _ in range(4):
            big = big @ big * np.float32(1e-3)  # keep the stream busy while the tables are made
        for lst in lists:
            amp.unscale_and_check(lst, 0.5)
    with other:
        for lst in lists[-8:]:  # cached tables from the busy stream
            amp.unscale_and_check(lst, 0.5)
    cp.cuda.Device().synchronize()
    for i, lst in enumerate(lists):
        want = 2.0 ** (i % 7) * (0.25 if i >= len(lists) - 8 else 0.5)
        for a in lst:
            assert bool((a == want).all()), (i, float(a[0]), want)


@pytest.mark.gpu
def test_scaler_end_to_end_with_device_flag(cp):
    s = amp.DynamicLossScaler(init_scale=4.0, growth_interval=2)
    g = cp.full(5, 8.0, dtype=np.float16)
    assert s.update(s.unscale_([g])) and s.scale == 4.0
    assert np.all(g.get() == 2.0)
    g[3] = np.inf
    assert not s.update(s.unscale_([g])) and s.scale == 2.0
