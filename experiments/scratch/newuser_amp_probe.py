#!/usr/bin/env python3
"""A new user's probe of ``cuflash.amp`` (unscale_and_check, check_finite, DynamicLossScaler, sgd_momentum_step,
adamw_step), through the public API only, against float64 NumPy references of the documented rules and against
PyTorch (``torch.amp.GradScaler`` / ``torch._amp_update_scale_``, ``torch.optim.SGD`` / ``AdamW``, fused and foreach).

Run from the repository root on a GPU machine:

    PYTHONPATH=. python experiments/scratch/newuser_amp_probe.py             # every check
    PYTHONPATH=. python experiments/scratch/newuser_amp_probe.py unscale_     # checks whose name contains a word
    PYTHONPATH=. python experiments/scratch/newuser_amp_probe.py --list      # the names

Prints ``PASS <check>``, ``FAIL <check>: <details>`` or ``SKIP <check>: <why>`` per check, then a summary; exit
status 1 if any check failed. Checks named ``*_undocumented`` test behaviour the docs do not state (aliasing,
determinism): a FAIL there is a hazard, not a broken promise. Checks named ``doc_*`` run the docstrings' recipes.

References: the documented update rules in float64 NumPy on the host values of the inputs (as rounded to their
dtypes), plus the same rules in float32 NumPy as the baseline of a float32 implementation. Tolerance for the fused
steps (the project's rule): max |out - ref64| <= 2 * max |ref32 - ref64| + 4 * 2^-24 * max |ref64|; against torch the
torch error is added. unscale_and_check is compared bit for bit with ``(float32(g) * float32(inv)).astype(g.dtype)``
(round to nearest even; NaN positions compared, not payloads), and with torch's
``_amp_foreach_non_finite_check_and_unscale_``. Model copies must equal ``round(master)`` bit for bit, and every
element must be written (poisoned with NaN first).

Environment: PROBE_BUDGET_S (default 45): no new check starts after that many seconds (the rest print SKIP);
PROBE_HARD_S (default 58): a watchdog reports the running check as hung and exits 1. Needs < 1 GB of GPU memory.
PROBE_TORCH_DEVICE=cpu runs torch's side on the CPU (a dry run of this script's own logic).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import zlib

T0 = time.time()

import numpy as np  # noqa: E402
import ml_dtypes  # noqa: E402

import cupy as cp  # noqa: E402

import cuflash  # noqa: E402
from cuflash import amp  # noqa: E402

try:
    import torch

    TDEV = os.environ.get("PROBE_TORCH_DEVICE", "cuda")  # "cpu" only for a dry run of this script's own logic
    if TDEV == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA device")
    TORCH_WHY = ""
except Exception as _e:  # torch is optional: its checks print SKIP
    torch = TDEV = None
    TORCH_WHY = f"torch unavailable ({type(_e).__name__}: {_e})"

BUDGET = float(os.environ.get("PROBE_BUDGET_S", "45"))
HARD = float(os.environ.get("PROBE_HARD_S", "58"))
DRYRUN = os.environ.get("PROBE_DRYRUN", "") == "1"  # (a host-only stand-in for CuPy: device-timing checks skip)

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I32 = np.dtype(np.int32)
GDTS = (F32, F16, BF16)
U32 = 2.0 ** -24
BIG = (1 << 20) + 3  # > 2^20 elements


from _probe_harness import (Fail, Skip, exc_text, gpu_name, raises_naming,  # noqa: E402  (experiments/scratch)
                            start_watchdog)

# ------------------------------------------------------------------------------------------------------------
# harness (as experiments/scratch/newuser_probe.py)
def _exc_text(e):
    return exc_text(e, __file__)


class Check:
    def __init__(self, name):
        self.name = name
        self.fails = []
        self.steps = 0
        self.skips = []

    @contextlib.contextmanager
    def sub(self, label):
        """One step: a Fail or any exception inside is recorded under ``label`` and the check goes on."""
        self.steps += 1
        try:
            yield
        except Fail as e:
            self.fails.append(f"[{label}] {e}")
        except Skip as e:  # (torch missing for this step, say): the step is skipped, the check goes on
            self.skips.append(f"[{label}] {e}")
        except Exception as e:
            self.fails.append(f"[{label}] unexpected {_exc_text(e)}")


CHECKS = []


def check(name, torch_needed=False, device_timing=False):
    def deco(f):
        CHECKS.append((name, f, torch_needed, device_timing))
        return f
    return deco


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


# ------------------------------------------------------------------------------------------------------------
# conversions and comparisons
def dev(h):
    """Device copy of a host array (any dtype, bfloat16 included; made on the host: no device bfloat16 kernels)."""
    return cp.asarray(np.array(h, order="C", copy=True))  # (np.ascontiguousarray makes a 0-d array 1-d)


def hst(a):
    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)


def f64(a):
    if torch is not None and isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return hst(a).astype(np.float64)


def rnd(x, dt):
    with np.errstate(all="ignore"):
        return np.asarray(x, np.float64).astype(F32).astype(dt) if np.dtype(dt) == BF16 else \
            np.asarray(x, np.float64).astype(dt)


def nan_like(shape, dt):
    return dev(np.full(shape, np.nan, np.float32).astype(dt))


def desc(a):
    if a is None:
        return "None"
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return f"{type(a).__name__}{tuple(a.shape)} {a.dtype}"
    return repr(a)[:80]


def _f(v):
    return f"{float(v):.9g}"


def _uint(h):
    """The raw bits (a view when ``h`` is C-contiguous, 0-d kept 0-d)."""
    h = np.asarray(h)
    if not h.flags.c_contiguous:
        h = h.copy()
    return h.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[h.dtype.itemsize])


def same_bits(what, out, ref):
    """``out`` (device or host) equals host ``ref`` bit for bit, except that NaNs only need the same positions."""
    o, r = hst(out), np.asarray(ref)
    if o.shape != r.shape or o.dtype != r.dtype:
        raise Fail(f"{what}: got {desc(o)}, expected {desc(r)}")
    if not o.size:
        return
    on, rn = np.isnan(o.astype(np.float32)), np.isnan(r.astype(np.float32))
    bad = (on != rn) | (~on & ~rn & (_uint(o) != _uint(r)))
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), o.shape)
        d = np.abs(o.astype(np.float64) - r.astype(np.float64))
        raise Fail(f"{what}: {int(bad.sum())} of {o.size} elements differ bitwise, first at {tuple(map(int, i))}: "
                   f"got {_f(o[i])}, expected {_f(r[i])}; max abs diff {float(np.nanmax(d, initial=0)):.3g}; "
                   f"{desc(o)}")


def close(what, out, r64, r32=None, extra=0.0):
    """max |out - r64| <= 2 max |r32 - r64| + 4 u32 max |r64| + extra, NaN / +-inf patterns equal."""
    o, r = f64(out), np.asarray(r64, np.float64)
    if o.shape != r.shape:
        raise Fail(f"{what}: shape {o.shape}, expected {r.shape}")
    for kind, fo, fr in (("NaN", np.isnan(o), np.isnan(r)), ("+inf", o == np.inf, r == np.inf),
                         ("-inf", o == -np.inf, r == -np.inf)):
        if (fo != fr).any():
            i = tuple(int(v) for v in np.argwhere(fo != fr)[0])
            raise Fail(f"{what}: {kind} pattern differs at {int((fo != fr).sum())} of {o.size}, first at {i}: got "
                       f"{_f(o[i])}, expected {_f(r[i])}")
    fin = np.isfinite(r)
    if not fin.any():
        return 0.0
    with np.errstate(all="ignore"):
        err = np.where(fin, np.abs(o - r), 0.0)
        base = 0.0 if r32 is None else float(np.max(np.where(fin, np.abs(np.asarray(r32, np.float64) - r), 0.0)))
    scale = float(np.max(np.abs(r[fin])))
    allowed = 2 * base + 4 * U32 * scale + extra
    if float(err.max()) > allowed:
        i = np.unravel_index(int(np.argmax(err)), r.shape)
        raise Fail(f"{what}: max abs err {float(err.max()):.3g} at {tuple(map(int, i))} (got {_f(o[i])}, expected "
                   f"{_f(r[i])}) > allowed {allowed:.3g} (float32 baseline {base:.3g}, max|ref| {scale:.3g}); "
                   f"{int((err > allowed).sum())} of {o.size} outside")
    return base


def expect_error(what, exc, words, fn, *args, **kwargs):
    """fn(*args, **kwargs) must raise ``exc`` whose message names every word of ``words`` (_probe_harness)."""
    return raises_naming(what, exc, words, lambda: fn(*args, **kwargs), desc, _exc_text)


def sync():
    cp.cuda.Device().synchronize()


def flag_val(f):
    return int(hst(f).reshape(-1)[0])


# torch helpers -------------------------------------------------------------------------------------------------
def tt(h):
    """torch tensor on TDEV with the host array's dtype and values (bfloat16 through float32: exact)."""
    h = np.array(h, order="C", copy=True)
    if h.dtype == BF16:
        return torch.from_numpy(h.astype(np.float32)).to(TDEV).to(torch.bfloat16)
    return torch.from_numpy(h.copy()).to(TDEV)


def t_host(t):
    """A torch tensor's host values in its own dtype (bfloat16 as ml_dtypes)."""
    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16)
    return t.numpy()


def need_torch():
    if torch is None:
        raise Skip(TORCH_WHY)


# references of the documented rules ----------------------------------------------------------------------------
def unscale_ref(h, inv):
    """g *= inv_scale in float32, rounded to g's dtype (to nearest even), as torch's unscale kernel."""
    with np.errstate(all="ignore"):
        return (np.asarray(h).astype(np.float32) * np.float32(inv)).astype(np.asarray(h).dtype)


def sgd_ref(p, buf, g, c, first, inv, ft):
    """torch.optim.SGD (the docstring's rule; momentum 0: no buffer, as torch) in dtype ``ft``."""
    ft = np.dtype(ft).type
    with np.errstate(all="ignore"):
        g = np.asarray(g).astype(ft) * ft(inv)
        g = g + ft(c["weight_decay"]) * p
        if c["momentum"] != 0:
            buf = g.copy() if first else ft(c["momentum"]) * buf + (ft(1) - ft(c["dampening"])) * g
            g = g + ft(c["momentum"]) * buf if c["nesterov"] else buf
        p = p - ft(c["lr"]) * g
    return p.astype(ft), (None if buf is None else np.asarray(buf).astype(ft))


def adamw_ref(p, m, v, g, c, step, inv, ft):
    """torch.optim.AdamW (the docstring's rule) in dtype ``ft``; bias corrections in float64 as documented."""
    ft = np.dtype(ft).type
    b1, b2 = c["betas"]
    with np.errstate(all="ignore"):
        g = np.asarray(g).astype(ft) * ft(inv)
        p = p * (ft(1) - ft(c["lr"]) * ft(c["weight_decay"]))
        m = ft(b1) * m + ft(1 - b1) * g
        v = ft(b2) * v + ft(1 - b2) * g * g
        bc1, bc2s = 1 - b1 ** step, math.sqrt(1 - b2 ** step)
        p = p - ft(c["lr"] / bc1) * (m / (np.sqrt(v) / ft(bc2s) + ft(c["eps"])))
    return p.astype(ft), m.astype(ft), v.astype(ft)


def sgd_kw(c):
    return {k: c[k] for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov")}


def adamw_kw(c):
    return {k: c[k] for k in ("lr", "betas", "eps", "weight_decay")}


# a kernel that keeps a stream busy (to make asynchronous hazards deterministic) -------------------------------
_SPIN = None


def spin(ms):
    """Occupy the current stream for ``ms`` milliseconds (one thread polling %globaltimer)."""
    global _SPIN
    if _SPIN is None:
        _SPIN = cp.RawKernel(r'''
extern "C" __global__ void probe_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}''', "probe_spin")
    _SPIN((1,), (1,), (np.uint64(int(ms * 1e6)),))


# ------------------------------------------------------------------------------------------------------------
# the docstrings' recipes
@check("doc_typical_loop_as_written")
def _(c):
    """DynamicLossScaler's 'Typical loop' (scale_loss, unscale_, update, optimizer step) against a float64 replay."""
    rng = rng_for(c.name)
    sizes, gdts, mdts = (1000, 1048, 1), (F16, BF16, F16), (F16, BF16, F32)
    G = [[rng.standard_normal(n) for n in sizes] for _ in range(6)]  # the "backward" of each step (unscaled)
    w0 = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    cfg = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=1e-3, nesterov=False)
    master = [dev(w) for w in w0]
    bufs = [nan_like(n, F32) for n in sizes]
    models = [nan_like(n, m) for n, m in zip(sizes, mdts)]
    s = amp.DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=2)
    r64 = [w.astype(np.float64) for w in w0]
    b64 = [np.zeros(n) for n in sizes]
    r32 = [w.copy() for w in w0]
    b32 = [np.zeros(n, np.float32) for n in sizes]
    applied, hist = 0, []
    with c.sub("the loop"):
        for t in range(6):
            loss = cp.asarray(np.float32(1.5))
            sl = s.scale_loss(loss)
            if abs(float(sl) - 1.5 * s.scale) > 1e-6 * s.scale:
                raise Fail(f"scale_loss(1.5) = {float(sl)} at scale {s.scale}")
            S = s.scale
            gh = [rnd(g * S, dt) for g, dt in zip(G[t], gdts)]
            if t == 2:
                gh[1][7] = np.inf  # an overflow in one tensor of the list
            grads = [dev(g) for g in gh]
            found = s.unscale_(grads)
            clean = s.update(found)
            hist.append((S, not clean))
            if clean:
                for i in range(len(sizes)):
                    amp.sgd_momentum_step(master[i], grads[i], bufs[i], models[i], first_step=applied == 0, **cfg)
                    g_unscaled = unscale_ref(gh[i], 1.0 / S)
                    r64[i], b64[i] = sgd_ref(r64[i], b64[i], g_unscaled, cfg, applied == 0, 1.0, F64)
                    r32[i], b32[i] = sgd_ref(r32[i], b32[i], g_unscaled, cfg, applied == 0, 1.0, F32)
                applied += 1
    expect = [(1024.0, False), (1024.0, False), (2048.0, True), (1024.0, False), (1024.0, False), (2048.0, False)]
    with c.sub("scale history (growth after 2 clean steps, halved on the overflow)"):
        if hist != expect or s.history != expect:
            raise Fail(f"history {s.history} (loop saw {hist}), expected {expect}")
    for i in range(len(sizes)):
        with c.sub(f"param {i} ({sizes[i]}, grad {gdts[i]}, model {mdts[i]})"):
            close("master", master[i], r64[i], r32[i])
            close("momentum_buf", bufs[i], b64[i], b32[i])
            same_bits("model == round(master)", models[i], hst(master[i]).astype(mdts[i]))


@check("doc_loop_variants_agree_fp16_small_grads")
def _(c):
    """The docstring offers two variants: unscale_ in place then step, or check + pass inv_scale to the fused step.
    With float16 gradients holding small true values (what loss scaling is for) they must give the same update."""
    rng = rng_for(c.name)
    n = 4096
    true = np.exp(rng.uniform(np.log(1e-9), np.log(1e-3), n)) * rng.choice([-1.0, 1.0], n)
    S = 2.0 ** 16  # the default init_scale
    g16 = rnd(true * S, F16)
    exact = g16.astype(np.float64) / S  # what the scaled float16 gradient holds, unscaled exactly
    cfg = dict(lr=1.0, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False)
    res = {}
    for variant in ("unscale_ in place", "check + inv_scale"):
        with c.sub(variant):
            s = amp.DynamicLossScaler()
            g = dev(g16)
            master, buf = dev(np.zeros(n, np.float32)), nan_like(n, F32)
            if variant == "unscale_ in place":
                ok = s.update(s.unscale_([g]))
                inv = 1.0
            else:
                found = s.check([g])
                inv = s.inv_scale
                ok = s.update(found)
            if not ok:
                raise Fail("the scaler reported an overflow on finite gradients")
            amp.sgd_momentum_step(master, g, buf, first_step=True, inv_scale=inv, **cfg)
            res[variant] = f64(buf)
            err = np.abs(res[variant] - exact) / np.abs(exact)
            if float(err.max()) > 2 * U32:
                i = int(np.argmax(err))
                raise Fail(f"momentum buffer (= the unscaled gradient on the first step) off by relative "
                           f"{float(err.max()):.3g} at |g| = {abs(exact[i]):.3g} (got {_f(res[variant][i])}, exact "
                           f"{_f(exact[i])}); {int((err > 2 * U32).sum())} of {n} elements beyond 2^-23 relative, "
                           f"{int((res[variant] == 0).sum())} flushed to 0: unscaling float16 in place underflows "
                           f"again below float16's normal range (6.1e-5)")


# ------------------------------------------------------------------------------------------------------------
# unscale_and_check
UNSCALE_SPEC = [(1, F32), (0, F16), (3, BF16), (BIG, F16), (255, F32), (256, BF16), (257, F16), (1025, F32),
                ((), F16), ((7, 9), BF16), ((0, 5), F32), (3 * 4097, BF16), (5, F32), (70001, F32)]


def make_list(rng, spec=UNSCALE_SPEC, scale=1000.0):
    host = [np.asarray(rng.standard_normal(sh) * scale, np.float32).astype(dt) for sh, dt in spec]  # 0-d stays an array
    return host, [dev(h) for h in host]


def torch_unscale(host, inv):
    """torch's multi-tensor unscale on the same data, per dtype group (as GradScaler groups them)."""
    ts = [tt(h) for h in host]
    found = torch.zeros(1, dtype=torch.float32, device=TDEV)
    invt = torch.full((1,), inv, dtype=torch.float32, device=TDEV)
    groups = {}
    for t in ts:
        if t.numel():
            groups.setdefault(t.dtype, []).append(t)
    for g in groups.values():
        torch._amp_foreach_non_finite_check_and_unscale_(g, found, invt)
    return [t_host(t) for t in ts], float(found.item())


@check("unscale_mixed_sizes_dtypes_vs_numpy_and_torch")
def _(c):
    rng = rng_for(c.name)
    inv = 1.0 / 3000.0  # not a power of two: every product rounds
    host, d = make_list(rng)
    with c.sub("list of 14 (1, empty, 0-d, 2-D, > 2^20, odd; float32/float16/bfloat16)"):
        flag = amp.unscale_and_check(d, inv)
        if not isinstance(flag, cp.ndarray) or flag.dtype != I32 or flag.shape != ():
            raise Fail(f"flag is {desc(flag)}, documented a 0-d int32 CuPy array")
        if flag_val(flag) != 0:
            raise Fail(f"flag {flag_val(flag)} on finite gradients")
        for i, (h, x) in enumerate(zip(host, d)):
            same_bits(f"grads[{i}] {h.dtype}{h.shape}", x, unscale_ref(h, inv))
    with c.sub("vs torch._amp_foreach_non_finite_check_and_unscale_"):
        need_torch()
        th, tf = torch_unscale(host, inv)
        if tf != 0:
            raise Fail(f"torch flagged finite data ({tf})")
        for i, (x, t) in enumerate(zip(d, th)):
            same_bits(f"grads[{i}] vs torch", x, t)
    with c.sub("tuple input, a single array (not a list), an empty list"):
        h2, d2 = make_list(rng, [(17, F16), (33, BF16)])
        amp.unscale_and_check(tuple(d2), 0.25)
        for h, x in zip(h2, d2):
            same_bits("tuple entry", x, unscale_ref(h, 0.25))
        one = dev(h2[0])
        f1 = amp.unscale_and_check(one, 2.0)
        same_bits("single array", one, unscale_ref(h2[0], 2.0))
        if flag_val(f1) != 0:
            raise Fail("flag set for a single finite array")
        fe = amp.unscale_and_check([], 0.5)
        if flag_val(fe) != 0 or fe.shape != ():
            raise Fail(f"empty list: flag {desc(fe)} = {flag_val(fe)}")


@check("unscale_nonfinite_in_one_of_many")
def _(c):
    rng = rng_for(c.name)
    inv = 0.5
    targets = [(0, 0), (3, BIG - 1), (3, 0), (9, (3, 4)), (8, ()), (13, 70000), (2, 1)]
    for bad in (np.inf, -np.inf, np.nan):
        for t, pos in targets:
            with c.sub(f"{bad} in grads[{t}] at {pos}"):
                host, _ = make_list(rng)
                host[t][pos] = bad
                d = [dev(h) for h in host]
                flag = amp.unscale_and_check(d, inv)
                if flag_val(flag) != 1:
                    raise Fail(f"flag {flag_val(flag)}, expected 1")
                for i, (h, x) in enumerate(zip(host, d)):  # every element unscaled, the bad one stays bad
                    same_bits(f"grads[{i}]", x, unscale_ref(h, inv))
                if torch is not None and (t, pos) == (3, BIG - 1):
                    th, tf = torch_unscale(host, inv)
                    if tf != 1:
                        raise Fail(f"torch's flag {tf}")
                    for i, (x, tv) in enumerate(zip(d, th)):
                        same_bits(f"grads[{i}] vs torch", x, tv)
    with c.sub("check_finite: a NaN in a list of three dtypes"):
        host, d = make_list(rng)
        host[11][5] = np.nan
        d[11] = dev(host[11])
        if flag_val(amp.check_finite(d)) != 1:
            raise Fail("check_finite missed a bfloat16 NaN")
        for i, (h, x) in enumerate(zip(host, d)):
            same_bits(f"grads[{i}] untouched by check_finite", x, h)


@check("unscale_found_inf_forms_and_write_false")
def _(c):
    rng = rng_for(c.name)
    h = rng.standard_normal(100).astype(np.float32)
    hb = h.copy()
    hb[50] = np.inf
    for label, mk in (("0-d", lambda: cp.zeros((), np.int32)), ("(1,)", lambda: cp.zeros((1,), np.int32)),
                      ("(1, 1)", lambda: cp.zeros((1, 1), np.int32))):
        with c.sub(f"found_inf {label}: returned itself, set on inf, OR semantics"):
            f = mk()
            r = amp.unscale_and_check([dev(h)], 0.5, found_inf=f)
            if r is not f or flag_val(f) != 0:
                raise Fail(f"returned {desc(r)} (is found_inf: {r is f}), value {flag_val(f)}")
            amp.unscale_and_check([dev(hb)], 0.5, found_inf=f)
            if flag_val(f) != 1:
                raise Fail(f"not set: {flag_val(f)}")
            amp.unscale_and_check([dev(h)], 0.5, found_inf=f)
            if flag_val(f) != 1:
                raise Fail(f"a clean list cleared a set flag: {flag_val(f)}")
            amp.check_finite([dev(h)], found_inf=f)
            if flag_val(f) != 1:
                raise Fail(f"check_finite cleared a set flag: {flag_val(f)}")
    with c.sub("found_inf a 1-element view into a larger int32 array: neighbours untouched"):
        big = dev(np.array([7, 7, 0, 7, 7], np.int32))
        amp.unscale_and_check([dev(hb)], 0.5, found_inf=big[2:3])
        if list(hst(big)) != [7, 7, 1, 7, 7]:
            raise Fail(f"flag array {list(hst(big))}, expected [7, 7, 1, 7, 7]")
    with c.sub("write=False: no store at all (NaN payloads, -0, subnormals keep their bits)"):
        for dt, pay in ((F32, 0x7FC00123), (F16, 0x7E01), (BF16, 0x7F81)):
            x = rng.standard_normal(4099).astype(np.float32).astype(dt)
            u = _uint(x)
            u[3] = pay
            u[4] = 0x8000 if dt.itemsize == 2 else 0x80000000  # -0
            u[5] = 1  # smallest subnormal
            xd = dev(x)
            f = amp.unscale_and_check([xd], 0.5, write=False)
            if flag_val(f) != 1:
                raise Fail(f"{dt}: NaN not flagged with write=False")
            if not np.array_equal(_uint(hst(xd)), u):
                raise Fail(f"{dt}: write=False changed bits")


@check("unscale_inv_scale_edges")
def _(c):
    rng = rng_for(c.name)
    host, _ = make_list(rng, [(1000, F32), (1000, F16), (1000, BF16)])
    for inv in (0.0, -0.25, -1.0 / 3000.0, 1.0, 3.0e38, np.float32(0.125), np.float16(0.5), ml_dtypes.bfloat16(0.25),
                np.float64(1 / 7), 2, np.int64(1)):
        with c.sub(f"inv_scale={inv!r} ({type(inv).__name__})"):
            d = [dev(h) for h in host]
            f = amp.unscale_and_check(d, inv)
            if flag_val(f) != 0:
                raise Fail(f"flag {flag_val(f)} (documented: set only for inf/NaN *before* unscaling)")
            for h, x in zip(host, d):
                same_bits(f"{h.dtype}", x, unscale_ref(h, float(inv)))
    with c.sub("inv_scale=0 with an inf: flagged; finite entries become +-0, the inf NaN (inf * 0)"):
        h = host[0].copy()
        h[3] = np.inf
        d = dev(h)
        if flag_val(amp.unscale_and_check([d], 0.0)) != 1:
            raise Fail("not flagged")
        same_bits("after", d, unscale_ref(h, 0.0))
    for bad, exc in ((float("nan"), ValueError), (float("inf"), ValueError), (-float("inf"), ValueError),
                     (1e39, ValueError), (None, TypeError), ("0.5", TypeError), (True, TypeError),
                     (complex(0.5, 0), TypeError)):
        with c.sub(f"inv_scale={bad!r}: {exc.__name__} before any launch"):
            d = [dev(h) for h in host]
            flag = cp.zeros((), np.int32)
            expect_error("inv_scale", exc, ["inv_scale"], amp.unscale_and_check, d, bad, flag)
            for h, x in zip(host, d):
                same_bits("untouched", x, h)
    for bad in ("cupy 0-d", "torch 0-d"):
        with c.sub(f"inv_scale a {bad} array: TypeError (documented: a real number)"):
            if bad == "torch 0-d":
                need_torch()
                v = torch.tensor(0.5, device=TDEV)
            else:
                v = cp.asarray(0.5)
            expect_error("inv_scale", TypeError, ["inv_scale"], amp.unscale_and_check, [dev(host[0])], v)


@check("unscale_subnormal_and_huge_grads")
def _(c):
    """g * inv_scale with subnormal inputs, subnormal products and products that overflow (IEEE, as torch/NumPy)."""
    rng = rng_for(c.name)
    cases = {
        F32: np.array([1e-40, -3e-39, 1.4e-45, -1.4e-45, 1.1754942e-38, 1e-30, 3.4028235e38, -3.4e38, 1.0, 0.0,
                       -0.0] + list(rng.standard_normal(5) * 1e-39), np.float32),
        BF16: np.array([1e-40, -5e-39, 9.2e-41, 1e-38, 3.3e38, -3.3e38, 1.0, 0.0], np.float32).astype(BF16),
        F16: np.array([6e-8, -6e-8, 3e-5, 6.1e-5, 65504.0, -65504.0, 1.0, 0.0], np.float16),
    }
    for dt, h in cases.items():
        for inv in (1.0, 0.5, 2.0, 2.0 ** -20):
            with c.sub(f"{dt} inv_scale={inv}"):
                d = dev(h)
                f = amp.unscale_and_check([d], inv)
                if flag_val(f) != 0:
                    raise Fail(f"flag {flag_val(f)} for finite inputs (overflow of the product is not flagged by "
                               "the docs: 'inf/NaN before unscaling')")
                same_bits("vs float32 NumPy (IEEE, no flush to zero)", d, unscale_ref(h, inv))
    with c.sub("vs torch on the float32 subnormals"):
        need_torch()
        th, _tf = torch_unscale([cases[F32]], 0.5)
        d = dev(cases[F32])
        amp.unscale_and_check([d], 0.5)
        same_bits("vs torch", d, th[0])
    with c.sub("check_finite: subnormals and float max are finite"):
        if flag_val(amp.check_finite([dev(h) for h in cases.values()])) != 0:
            raise Fail("flagged")


@check("unscale_bad_input_raises_before_launch")
def _(c):
    rng = rng_for(c.name)
    h32 = rng.standard_normal(64).astype(np.float32)
    h16 = rng.standard_normal(64).astype(np.float16)

    def run(label, exc, words, build, **kw):
        with c.sub(label):
            g32, g16 = dev(h32), dev(h16)
            expect_error(label, exc, words, amp.unscale_and_check, build(g32, g16), kw.pop("inv", 0.5), **kw)
            same_bits("an earlier valid float32 gradient untouched", g32, h32)
            same_bits("an earlier valid float16 gradient untouched", g16, h16)

    run("a NumPy array in the list", TypeError, ["grads[2]", "CuPy"], lambda a, b: [a, b, h32.copy()])
    run("None in the list", TypeError, ["grads[2]"], lambda a, b: [a, b, None])
    run("int32 gradient", TypeError, ["grads[2]", "int32"], lambda a, b: [a, b, cp.ones(5, np.int32)])
    run("float64 gradient", TypeError, ["grads[2]", "float64"], lambda a, b: [a, b, cp.ones(5, np.float64)])
    run("complex64 gradient", TypeError, ["grads[2]", "complex"], lambda a, b: [a, b, cp.ones(5, np.complex64)])
    run("uint16 gradient (a bfloat16 stored as raw bits)", TypeError, ["grads[2]", "uint16"],
        lambda a, b: [a, b, cp.ones(5, np.uint16)])
    run("a strided view", ValueError, ["grads[2]", "contiguous"], lambda a, b: [a, b, cp.ones(10, np.float32)[::2]])
    run("a transposed 2-D array", ValueError, ["grads[2]", "contiguous"],
        lambda a, b: [a, b, cp.ones((4, 6), np.float16).T])
    run("found_inf a NumPy array", TypeError, ["found_inf"], lambda a, b: [a, b],
        found_inf=np.zeros((), np.int32))
    run("found_inf float32", ValueError, ["found_inf", "int32"], lambda a, b: [a, b],
        found_inf=cp.zeros((), np.float32))
    run("found_inf int64", ValueError, ["found_inf", "int32"], lambda a, b: [a, b], found_inf=cp.zeros((), np.int64))
    run("found_inf of 2 elements", ValueError, ["found_inf"], lambda a, b: [a, b], found_inf=cp.zeros(2, np.int32))
    run("found_inf of 0 elements", ValueError, ["found_inf"], lambda a, b: [a, b], found_inf=cp.zeros(0, np.int32))
    run("write=2", TypeError, ["write"], lambda a, b: [a, b], write=2)
    if torch is not None:
        run("a torch tensor in the list", TypeError, ["grads[2]", "CuPy"],
            lambda a, b: [a, b, torch.ones(4, device=TDEV)])
    with c.sub("grads=None"):
        expect_error("None", TypeError, ["grads"], amp.unscale_and_check, None, 0.5)
    with c.sub("check_finite: a NumPy array"):
        expect_error("numpy", TypeError, ["CuPy"], amp.check_finite, [h32])
    with c.sub("an empty non-contiguous array is accepted (documented: non-empty only)"):
        if flag_val(amp.unscale_and_check([cp.ones((0, 8), np.float32)[:, ::2]], 0.5)) != 0:
            raise Fail("flag set")
    with c.sub("a generator of arrays: works or TypeError (not a crash, not a silent no-op)"):
        g32 = dev(h32)
        try:
            amp.unscale_and_check((x for x in [g32]), 0.5)
        except TypeError:
            same_bits("untouched after TypeError", g32, h32)
        else:
            same_bits("unscaled", g32, unscale_ref(h32, 0.5))


@check("unscale_alias_same_array_twice_undocumented")
def _(c):
    """Docs are silent on aliasing. Accepted: a ValueError/TypeError, or one consistent result for every element
    (each list entry applied once: g * inv^2; or de-duplicated: g * inv). Not accepted: a mixture (a data race)."""
    rng = rng_for(c.name)
    for n in (1000, BIG):
        with c.sub(f"[a, a], n={n}"):
            h = rng.integers(1, 1000, n).astype(np.float32)  # g, g/2, g/4 exact
            a = dev(h)
            try:
                amp.unscale_and_check([a, a], 0.5)
            except (ValueError, TypeError):
                same_bits("untouched after the error", a, h)
                continue
            o = hst(a)
            once, twice = int((o == h * 0.5).sum()), int((o == h * 0.25).sum())
            if once != n and twice != n:
                raise Fail(f"accepted and racy: {twice} elements unscaled twice, {once} once, "
                           f"{n - once - twice} neither (two threads read-modify-write the same element)")
    with c.sub("overlapping views [x[0:2000], x[1000:3000]]"):
        h = rng.integers(1, 1000, 3000).astype(np.float32)
        x = dev(h)
        try:
            amp.unscale_and_check([x[0:2000], x[1000:3000]], 0.5)
        except (ValueError, TypeError):
            same_bits("untouched after the error", x, h)
        else:
            o = hst(x)[1000:2000]
            hh = h[1000:2000]
            once, twice = int((o == hh * 0.5).sum()), int((o == hh * 0.25).sum())
            if once != 1000 and twice != 1000:
                raise Fail(f"accepted and racy on the overlap: {twice} twice, {once} once, "
                           f"{1000 - once - twice} neither")


@check("unscale_table_cache_lists_of_same_shapes")
def _(c):
    """The device pointer table is cached per list: new arrays of the same shapes (often at the same pool
    addresses), reordered lists, sub-lists and more lists than the cache holds must each be unscaled correctly."""
    rng = rng_for(c.name)
    spec = [(129, F32), (4097, F16), (1, BF16), (33, F32)]
    with c.sub("fresh lists of the same shapes, freed in between (pool reuse)"):
        for rep in range(4):
            host, d = make_list(rng, spec)
            amp.unscale_and_check(d, 0.25)
            for i, (h, x) in enumerate(zip(host, d)):
                same_bits(f"rep {rep} grads[{i}]", x, unscale_ref(h, 0.25))
            del d
    with c.sub("two live lists alternating, reversed, a sub-list"):
        ha, da = make_list(rng, spec)
        hb, db = make_list(rng, spec)
        ea, eb = [h.copy() for h in ha], [h.copy() for h in hb]
        for k, (lst, which) in enumerate(((da, "a"), (db, "b"), (da[::-1], "a"), (db[1:3], "b13"), (da, "a"))):
            amp.unscale_and_check(lst, 0.5)
            if which == "a":
                ea = [unscale_ref(h, 0.5) for h in ea]
            elif which == "b":
                eb = [unscale_ref(h, 0.5) for h in eb]
            else:
                eb = [unscale_ref(h, 0.5) if i in (1, 2) else h for i, h in enumerate(eb)]
            for i in range(len(spec)):
                same_bits(f"call {k}: a[{i}]", da[i], ea[i])
                same_bits(f"call {k}: b[{i}]", db[i], eb[i])
    with c.sub("a freed float32 list, then a bfloat16 list of the same element counts"):
        host, d = make_list(rng, [(300, F32), (77, F32)])
        amp.unscale_and_check(d, 0.5)
        del d
        host, d = make_list(rng, [(300, BF16), (77, BF16)])
        amp.unscale_and_check(d, 0.5)
        for i, (h, x) in enumerate(zip(host, d)):
            same_bits(f"bf16 grads[{i}]", x, unscale_ref(h, 0.5))
    with c.sub("90 distinct live lists (more than the cache), two rounds"):
        lists = [make_list(rng, [(50 + i % 7, GDTS[i % 3]), (9, F16)]) for i in range(90)]
        exp = [[h.copy() for h in hs] for hs, _ in lists]
        for rnd_ in range(2):
            for i, (_, d) in enumerate(lists):
                amp.unscale_and_check(d, 0.5)
                exp[i] = [unscale_ref(h, 0.5) for h in exp[i]]
        for i, (_, d) in enumerate(lists):
            for j, x in enumerate(d):
                same_bits(f"list {i}[{j}]", x, exp[i][j])


@check("optim_and_unscale_on_nondefault_stream", device_timing=True)
def _(c):
    """Everything goes to the current CuPy stream (docs: no host sync): queued behind a busy stream, nothing
    happens until it runs; then the results are right."""
    rng = rng_for(c.name)
    s, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    host, d = make_list(rng, [(5000, F32), (3000, F16), (7, BF16)])
    n = 4096
    p0 = rng.standard_normal(n).astype(np.float32)
    g = rnd(rng.standard_normal(n) * 64, BF16)
    master, buf, model = dev(p0), nan_like(n, F32), nan_like(n, F16)
    ea, eas, master2, model2 = dev(np.zeros(n, np.float32)), dev(np.zeros(n, np.float32)), dev(p0), nan_like(n, BF16)
    gd = dev(g)
    # compile (first use) outside the timed window: the same kernels on one element
    amp.unscale_and_check([dev(h[:1]) for h in host], 0.5)
    amp.sgd_momentum_step(dev(p0[:1]), dev(g[:1]), nan_like(1, F32), nan_like(1, F16), lr=0.1, first_step=True)
    amp.adamw_step(dev(p0[:1]), dev(g[:1]), dev(np.zeros(1, np.float32)), dev(np.zeros(1, np.float32)),
                   nan_like(1, BF16), lr=1e-2, step=1)
    spin(1)
    sync()
    with c.sub("queued on the current stream"):
        with s:
            spin(250)
            ev = s.record()
            flag = amp.unscale_and_check(d, 0.5)
            amp.sgd_momentum_step(master, gd, buf, model, lr=0.1, first_step=True, inv_scale=1 / 64, found_inf=flag)
            amp.adamw_step(master2, gd, ea, eas, model2, lr=1e-2, step=1, inv_scale=1 / 64, found_inf=flag)
        early = [x.get(stream=s2) for x in d] + [master.get(stream=s2), master2.get(stream=s2)]
        if ev.done:
            c.skips.append("[queued on the current stream] the busy kernel ended before the early read: ordering "
                           "not verified")
        else:
            changed = [i for i, (e, h) in enumerate(zip(early, host + [p0, p0]))
                       if not np.array_equal(_uint(e), _uint(h))]
            if changed:
                raise Fail(f"arrays {changed} (of grads..., sgd master, adamw master) changed while the current "
                           "stream was still busy: a launch went to another stream")
        s.synchronize()
        for i, (h, x) in enumerate(zip(host, d)):
            same_bits(f"grads[{i}] after the stream ran", x, unscale_ref(h, 0.5))
        if flag_val(flag) != 0:
            raise Fail(f"flag {flag_val(flag)}")
        c0 = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False)
        r64, _ = sgd_ref(p0.astype(np.float64), None, g, c0, True, 1 / 64, F64)
        r32, _ = sgd_ref(p0.copy(), None, g, c0, True, 1 / 64, F32)
        close("sgd master", master, r64, r32)
        same_bits("sgd model", model, hst(master).astype(F16))
        ca = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
        a64 = adamw_ref(p0.astype(np.float64), np.zeros(n), np.zeros(n), g, ca, 1, 1 / 64, F64)
        a32 = adamw_ref(p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32), g, ca, 1, 1 / 64, F32)
        close("adamw master", master2, a64[0], a32[0])
        same_bits("adamw model", model2, hst(master2).astype(BF16))


# ------------------------------------------------------------------------------------------------------------
# fused optimizer steps
SGD_CFGS = [dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False),
            dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=1e-2, nesterov=True),
            dict(lr=0.02, momentum=0.8, dampening=0.3, weight_decay=5e-3, nesterov=False),
            dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=1e-2, nesterov=False),
            dict(lr=0.1, momentum=0.0, dampening=0.5, weight_decay=0.0, nesterov=False),  # torch ignores dampening
            dict(lr=0.5, momentum=0.99, dampening=0.0, weight_decay=0.1, nesterov=True)]
ADAMW_CFGS = [dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
              dict(lr=3e-3, betas=(0.5, 0.9), eps=1e-3, weight_decay=0.1),
              dict(lr=1e-3, betas=(0.0, 0.0), eps=1e-6, weight_decay=0.0),
              dict(lr=1e-1, betas=(0.95, 0.9999), eps=1e-8, weight_decay=0.5),
              dict(lr=2e-2, betas=[0.8, 0.99], eps=1e-7, weight_decay=1e-4)]  # betas as a list
STEPS = 5
INV = 1.0 / 1024.0


def torch_opt(kind, p0, grads, c, inv, variant):
    """Run torch.optim.SGD / AdamW (float32 params, grad = float32(g) * inv) over ``grads``; return host arrays."""
    p = torch.nn.Parameter(tt(p0))
    kw = dict(fused=True) if variant == "fused" else dict(foreach=variant == "foreach")
    if kind == "sgd":
        opt = torch.optim.SGD([p], **sgd_kw(c), **kw)
    else:
        opt = torch.optim.AdamW([p], lr=c["lr"], betas=tuple(c["betas"]), eps=c["eps"],
                                weight_decay=c["weight_decay"], **kw)
    for g in grads:
        p.grad = tt(g).float() * inv
        opt.step()
    st = opt.state[p]
    if kind == "sgd":
        b = st.get("momentum_buffer")
        return f64(p), (None if b is None else f64(b))
    return f64(p), f64(st["exp_avg"]), f64(st["exp_avg_sq"]), float(st["step"])


@check("sgd_multistep_vs_float64_and_torch")
def _(c):
    rng = rng_for(c.name)
    combos = [(F16, BF16), (BF16, F16), (F32, None), (F16, F32), (BF16, BF16), (F32, F16)]
    for ci, cfg in enumerate(SGD_CFGS):
        for k, (gdt, mdt) in enumerate(combos[ci % 3: ci % 3 + 2] if ci else combos):
            n = BIG if (ci, k) == (1, 0) else 4099
            with c.sub(f"cfg {ci} {cfg} grad {gdt} model {mdt} n={n}"):
                p0 = rng.standard_normal(n).astype(np.float32)
                grads = [rnd(rng.standard_normal(n) * 1024 * rng.choice([1e-3, 1.0, 4.0], n), gdt)
                         for _ in range(STEPS)]
                master, buf = dev(p0), nan_like(n, F32)
                model = None if mdt is None else nan_like(n, mdt)
                r64, b64 = p0.astype(np.float64), np.zeros(n)
                r32, b32 = p0.copy(), np.zeros(n, np.float32)
                for t, g in enumerate(grads):
                    if model is not None and t:
                        model = nan_like(n, mdt)  # every element must be rewritten each step
                    ret = amp.sgd_momentum_step(master, dev(g), buf, model, first_step=t == 0, inv_scale=INV,
                                                **sgd_kw(cfg))
                    if ret is not master:
                        raise Fail(f"returned {desc(ret)}, documented: master")
                    r64, b64 = sgd_ref(r64, b64, g, cfg, t == 0, INV, F64)
                    r32, b32 = sgd_ref(r32, b32, g, cfg, t == 0, INV, F32)
                close("master vs float64", master, r64, r32)
                if cfg["momentum"]:
                    close("momentum_buf vs float64", buf, b64, b32)
                else:
                    if not np.isnan(hst(buf)).all():
                        raise Fail("momentum 0: the buffer was written (torch keeps none)")
                if model is not None:
                    same_bits("model == round(master)", model, hst(master).astype(mdt))
                if torch is not None and gdt != F32:
                    for variant in ("foreach", "fused"):
                        tp, tb = torch_opt("sgd", p0, grads, cfg, INV, variant)
                        terr = float(np.max(np.abs(tp - r64)))
                        close(f"master vs torch {variant}", master, tp, r32, extra=terr)
                        if cfg["momentum"]:
                            close(f"buf vs torch {variant}", buf, tb, b32, extra=float(np.max(np.abs(tb - b64))))


@check("adamw_multistep_vs_float64_and_torch")
def _(c):
    rng = rng_for(c.name)
    combos = [(F16, BF16), (BF16, F16), (F32, None), (F16, F32), (BF16, BF16), (F32, F16)]
    for ci, cfg in enumerate(ADAMW_CFGS):
        for gdt, mdt in (combos if ci == 0 else combos[ci % 4: ci % 4 + 2]):
            n = BIG if (ci, gdt) == (0, BF16) else 4099
            with c.sub(f"cfg {ci} {cfg} grad {gdt} model {mdt} n={n}"):
                p0 = rng.standard_normal(n).astype(np.float32)
                grads = [rnd(rng.standard_normal(n) * 1024 * rng.choice([1e-3, 1.0, 4.0], n), gdt)
                         for _ in range(STEPS)]
                master = dev(p0)
                ea, eas = dev(np.zeros(n, np.float32)), dev(np.zeros(n, np.float32))
                model = None if mdt is None else nan_like(n, mdt)
                r64 = (p0.astype(np.float64), np.zeros(n), np.zeros(n))
                r32 = (p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32))
                for t, g in enumerate(grads, start=1):
                    if model is not None and t > 1:
                        model = nan_like(n, mdt)
                    ret = amp.adamw_step(master, dev(g), ea, eas, model, step=t, inv_scale=INV, **adamw_kw(cfg))
                    if ret is not master:
                        raise Fail(f"returned {desc(ret)}, documented: master")
                    r64 = adamw_ref(*r64, g, cfg, t, INV, F64)
                    r32 = adamw_ref(*r32, g, cfg, t, INV, F32)
                close("master vs float64", master, r64[0], r32[0])
                close("exp_avg vs float64", ea, r64[1], r32[1])
                close("exp_avg_sq vs float64", eas, r64[2], r32[2])
                if model is not None:
                    same_bits("model == round(master)", model, hst(master).astype(mdt))
                if torch is not None and gdt != F32:
                    for variant in ("foreach", "fused"):
                        tp, tm, tv, tstep = torch_opt("adamw", p0, grads, cfg, INV, variant)
                        if tstep != STEPS:
                            raise Fail(f"torch {variant} step count {tstep}")
                        close(f"master vs torch {variant}", master, tp, r32[0],
                              extra=float(np.max(np.abs(tp - r64[0]))))
                        close(f"exp_avg vs torch {variant}", ea, tm, r32[1], extra=float(np.max(np.abs(tm - r64[1]))))
                        close(f"exp_avg_sq vs torch {variant}", eas, tv, r32[2],
                              extra=float(np.max(np.abs(tv - r64[2]))))


@check("optim_found_inf_skips_whole_step_no_partial_update")
def _(c):
    rng = rng_for(c.name)
    shapes = [1, 0, 3, BIG, 4097, (7, 9), (), 70001]
    gdts = [GDTS[i % 3] for i in range(len(shapes))]
    mdts = [(BF16, F16, None, F32)[i % 4] for i in range(len(shapes))]
    p0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gh = [rnd(rng.standard_normal(s) * 100, dt) for s, dt in zip(shapes, gdts)]
    gh[4][4096] = np.inf  # one element of one tensor of many
    state = {}

    def fresh():
        state["m"] = [dev(p) for p in p0]
        state["buf"] = [nan_like(np.shape(p), F32) for p in p0]
        state["ea"] = [dev(np.zeros(np.shape(p), np.float32)) for p in p0]
        state["eas"] = [dev(np.zeros(np.shape(p), np.float32)) for p in p0]
        state["ma"] = [dev(p) for p in p0]
        state["mod"] = [None if m is None else nan_like(np.shape(p), m) for p, m in zip(p0, mdts)]
        state["mod2"] = [None if m is None else nan_like(np.shape(p), m) for p, m in zip(p0, mdts)]

    def unchanged(label):
        for i in range(len(shapes)):
            same_bits(f"{label}: sgd master[{i}]", state["m"][i], p0[i])
            same_bits(f"{label}: adamw master[{i}]", state["ma"][i], p0[i])
            if np.size(p0[i]):
                if not np.isnan(hst(state["buf"][i])).all():
                    raise Fail(f"{label}: momentum_buf[{i}] written")
                for k in ("ea", "eas"):
                    if np.any(hst(state[k][i]) != 0):
                        raise Fail(f"{label}: {k}[{i}] written")
                for k in ("mod", "mod2"):
                    if state[k][i] is not None and not np.isnan(hst(state[k][i]).astype(np.float32)).all():
                        raise Fail(f"{label}: model copy [{i}] written")

    def steps(flag):
        gd = [dev(g) for g in gh]
        for i in range(len(shapes)):
            amp.sgd_momentum_step(state["m"][i], gd[i], state["buf"][i], state["mod"][i], lr=0.1, first_step=True,
                                  inv_scale=INV, found_inf=flag)
            amp.adamw_step(state["ma"][i], gd[i], state["ea"][i], state["eas"][i], state["mod2"][i], lr=1e-2, step=1,
                           inv_scale=INV, found_inf=flag)

    with c.sub("check_finite over the list flags the one inf; every step skipped, nothing written"):
        fresh()
        flag = amp.check_finite([dev(g) for g in gh])
        if flag_val(flag) != 1:
            raise Fail(f"flag {flag_val(flag)}")
        steps(flag)
        unchanged("flag from check_finite")
    for label, mk in (("(1,) holding 1", lambda: dev(np.array([1], np.int32))),
                      ("0-d holding 2", lambda: dev(np.array(2, np.int32))),
                      ("0-d holding -1", lambda: dev(np.array(-1, np.int32))),
                      ("a view [3:4] of an int32 array", lambda: dev(np.array([0, 0, 0, 5, 0], np.int32))[3:4])):
        with c.sub(f"found_inf {label}: skipped ('nonzero')"):
            fresh()
            steps(mk())
            unchanged(label)
    with c.sub("flag 0: every parameter updated (the inf one to NaN/inf as the rule gives)"):
        fresh()
        steps(dev(np.zeros((), np.int32)))
        for i in range(len(shapes)):
            if not np.size(p0[i]):
                continue
            cfg = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False)
            r64, _ = sgd_ref(p0[i].astype(np.float64), None, gh[i], cfg, True, INV, F64)
            r32, _ = sgd_ref(p0[i].copy(), None, gh[i], cfg, True, INV, F32)
            close(f"sgd master[{i}]", state["m"][i], r64, r32)
    with c.sub("no found_inf, a NaN in one element: only that element of that tensor becomes NaN"):
        h = rng.standard_normal(1000).astype(np.float32)
        g = rng.standard_normal(1000).astype(np.float32)
        g[123] = np.nan
        m = dev(h)
        amp.sgd_momentum_step(m, dev(g), nan_like(1000, F32), lr=0.1, first_step=True)
        nn = np.isnan(hst(m))
        if nn.sum() != 1 or not nn[123]:
            raise Fail(f"NaN at {list(np.flatnonzero(nn))[:10]}")


def gradscaler_loop(c, kind, n=4099, T=11, overflow=(0, 4, 5), literal=False):
    """torch GradScaler + torch optimizer vs DynamicLossScaler + check + fused step, the same gradients each step
    (scaled by each side's own scale, an inf injected at the ``overflow`` steps). cuflash side: step count and
    first_step advance only on applied steps (the host knows: update() syncs); inv_scale read before update()
    unless ``literal`` (the docstring's loop order: the fused step after update())."""
    need_torch()
    rng = rng_for(c.name + kind)
    gi, init = 3, 2.0 ** 12
    G = [rng.standard_normal(n) * 1e-3 for _ in range(T)]
    p0 = rng.standard_normal(n).astype(np.float32)
    if kind == "sgd":
        cfg = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=1e-3, nesterov=True)
    else:
        cfg = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)

    def scaled(t, S):
        g = rnd(G[t] * S, F16)
        if t in overflow:
            g[t % n] = np.inf
        return g

    # torch: non-fused SGD (GradScaler skips step(): no momentum buffer until the first applied step; torch's fused
    # SGD would allocate an uninitialised buffer on a skipped first step); fused AdamW (found_inf passed in)
    p = torch.nn.Parameter(tt(p0))
    if kind == "sgd":
        opt = torch.optim.SGD([p], **sgd_kw(cfg), foreach=True)
    else:
        opt = torch.optim.AdamW([p], lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"],
                                weight_decay=cfg["weight_decay"], fused=True)
    ts = torch.amp.GradScaler(TDEV, init_scale=init, growth_interval=gi)
    t_hist = []
    for t in range(T):
        S = float(ts.get_scale())
        ts.scale(torch.ones((), device=TDEV))
        p.grad = tt(scaled(t, S)).float()
        ts.step(opt)
        ts.update()
        t_hist.append(S)
    # cuflash
    s = amp.DynamicLossScaler(init_scale=init, growth_interval=gi)
    master = dev(p0)
    model = nan_like(n, BF16)
    st = [nan_like(n, F32)] if kind == "sgd" else [dev(np.zeros(n, np.float32)), dev(np.zeros(n, np.float32))]
    applied, c_hist, c_used_inv = 0, [], []
    for t in range(T):
        S = s.scale
        c_hist.append(S)
        gd = dev(scaled(t, S))
        found = s.check([gd])
        inv = s.inv_scale
        clean = s.update(found)
        if clean:
            if literal:
                inv = s.inv_scale  # read where the docstring's loop calls the step: after update()
            c_used_inv.append((t, inv * S))
            if kind == "sgd":
                amp.sgd_momentum_step(master, gd, st[0], model, first_step=applied == 0, inv_scale=inv,
                                      **sgd_kw(cfg))
            else:
                amp.adamw_step(master, gd, st[0], st[1], model, step=applied + 1, inv_scale=inv, **adamw_kw(cfg))
            applied += 1
    if c_hist != t_hist:
        raise Fail(f"scale used per step: cuflash {c_hist}, torch {t_hist}")
    if s.growth_tracker != int(ts.state_dict()["_growth_tracker"]) or s.scale != float(ts.get_scale()):
        raise Fail(f"after the loop: cuflash scale {s.scale} tracker {s.growth_tracker}; torch "
                   f"{ts.get_scale()} {ts.state_dict()['_growth_tracker']}")
    bad_inv = [(t, r) for t, r in c_used_inv if r != 1.0]
    # float64 replay of the documented rule (the clean steps only)
    r64 = [p0.astype(np.float64)] + ([np.zeros(n)] if kind == "sgd" else [np.zeros(n), np.zeros(n)])
    r32 = [p0.copy()] + ([np.zeros(n, np.float32)] if kind == "sgd" else [np.zeros(n, np.float32)] * 2)
    k = 0
    for t in range(T):
        if t in overflow:
            continue
        g = scaled(t, t_hist[t])
        if kind == "sgd":
            r64 = list(sgd_ref(r64[0], r64[1], g, cfg, k == 0, 1 / t_hist[t], F64))
            r32 = list(sgd_ref(r32[0], r32[1], g, cfg, k == 0, 1 / t_hist[t], F32))
        else:
            r64 = list(adamw_ref(*r64, g, cfg, k + 1, 1 / t_hist[t], F64))
            r32 = list(adamw_ref(*r32, g, cfg, k + 1, 1 / t_hist[t], F32))
        k += 1
    tp = f64(p)
    stt = opt.state[p]
    tst = [f64(stt["momentum_buffer"])] if kind == "sgd" else [f64(stt["exp_avg"]), f64(stt["exp_avg_sq"])]
    if kind == "adamw" and int(float(stt["step"])) != k:
        raise Fail(f"torch's step count {float(stt['step'])}, applied steps {k}")
    names = ["momentum_buf"] if kind == "sgd" else ["exp_avg", "exp_avg_sq"]
    try:
        close("master vs torch", master, tp, r32[0], extra=float(np.max(np.abs(tp - r64[0]))))
        for nm, a, tv, a64, a32 in zip(names, st, tst, r64[1:], r32[1:]):
            close(f"{nm} vs torch", a, tv, a32, extra=float(np.max(np.abs(tv - a64))))
        same_bits("model == round(master)", model, hst(master).astype(BF16))
    except Fail as e:
        if bad_inv:
            raise Fail(f"{e}; the steps {[t for t, _ in bad_inv]} were unscaled by inv_scale * scale_used = "
                       f"{sorted({r for _, r in bad_inv})} (update() had already grown the scale)")
        raise
    if bad_inv:
        raise Fail(f"steps {[t for t, _ in bad_inv]} used inv_scale * scale_used = {sorted({r for _, r in bad_inv})}")


@check("scaler_loop_vs_torch_gradscaler_sgd", torch_needed=True)
def _(c):
    with c.sub("SGD nesterov, overflow on the first step and on steps 4, 5; growth every 3 clean steps"):
        gradscaler_loop(c, "sgd")


@check("scaler_loop_vs_torch_gradscaler_adamw", torch_needed=True)
def _(c):
    with c.sub("AdamW fused (torch) with GradScaler, overflows on steps 0, 4, 5"):
        gradscaler_loop(c, "adamw")


@check("doc_loop_fused_variant_literal_order", torch_needed=True)
def _(c):
    """The docstring's loop with its fused alternative: check(), update(), then the step given scaler.inv_scale
    (read where the loop calls the step). On a step where update() grows the scale, that inv_scale is already
    1/(2S) for gradients scaled by S."""
    with c.sub("SGD, inv_scale read after update()"):
        gradscaler_loop(c, "sgd", literal=True)


@check("scaler_policy_vs_torch_amp_update_scale", torch_needed=True)
def _(c):
    rng = rng_for(c.name)
    for gf, bf, gi, init in ((2.0, 0.5, 1, 2.0 ** 16), (2.0, 0.5, 3, 1024.0), (3.0, 0.3, 2, 7.0),
                             (1.5, 0.75, 5, 2.0 ** 16), (2.0, 0.5, 2000, 2.0 ** 16)):
        with c.sub(f"growth {gf} backoff {bf} interval {gi} init {init}"):
            scale = torch.full((1,), init, dtype=torch.float32, device=TDEV)
            tracker = torch.zeros(1, dtype=torch.int32, device=TDEV)
            s = amp.DynamicLossScaler(init_scale=init, growth_factor=gf, backoff_factor=bf, growth_interval=gi)
            T = 4500 if gi == 2000 else 300
            pat = rng.random(T) < {2000: 0.002, 1: 0.5}.get(gi, 0.25)  # (no drift into float32's ceiling)
            for t, f in enumerate(pat):
                found = torch.full((1,), float(f), dtype=torch.float32, device=TDEV)
                torch._amp_update_scale_(scale, tracker, found, gf, bf, gi)
                r = s.update(bool(f))
                if r == bool(f):
                    raise Fail(f"step {t}: update returned {r} for overflow {bool(f)}")
                ts_, tt_ = float(scale.item()), int(tracker.item())
                if abs(s.scale - ts_) > 2e-5 * ts_ or s.growth_tracker != tt_:
                    raise Fail(f"step {t}: cuflash scale {s.scale!r} tracker {s.growth_tracker}; torch {ts_!r} {tt_}")
    with c.sub("growth near float32's top: torch keeps the scale finite in float32 (max 2^127 by doubling)"):
        scale = torch.full((1,), 2.0 ** 125, dtype=torch.float32, device=TDEV)
        tracker = torch.zeros(1, dtype=torch.int32, device=TDEV)
        s = amp.DynamicLossScaler(init_scale=2.0 ** 125, growth_interval=1)
        for t in range(6):
            torch._amp_update_scale_(scale, tracker, torch.zeros(1, device=TDEV), 2.0, 0.5, 1)
            s.update(False)
        if s.scale != float(scale.item()):
            g = dev(np.ones(8, np.float32))
            amp.unscale_and_check([g], s.inv_scale)
            raise Fail(f"cuflash scale {s.scale!r} = 2^{math.log2(s.scale):.0f} vs torch {float(scale.item())!r}; "
                       f"inv_scale {s.inv_scale!r} as float32 is {float(np.float32(s.inv_scale))!r}: unscale turns "
                       f"1.0 into {float(hst(g)[0])!r} without a flag")


@check("scaler_update_flag_forms")
def _(c):
    """update() takes 'the device flag from unscale_ ... or a Python bool/int'; unscale_and_check documents
    0-d or 1-element int32 flags."""
    forms = [("0-d CuPy int32", lambda v: cp.asarray(np.int32(v))),
             ("(1,) CuPy int32 (unscale_and_check's 1-element found_inf)", lambda v: dev(np.array([v], np.int32))),
             ("(1, 1) CuPy int32", lambda v: dev(np.array([[v]], np.int32))),
             ("Python bool", bool), ("Python int", int), ("NumPy int32", np.int32), ("NumPy bool", np.bool_)]
    if torch is not None:
        forms.append(("torch 0-d", lambda v: torch.tensor(float(v), device=TDEV)))
        forms.append(("torch (1,)", lambda v: torch.tensor([float(v)], device=TDEV)))
    for label, mk in forms:
        with c.sub(label):
            s = amp.DynamicLossScaler(init_scale=8.0, growth_interval=1)
            if s.update(mk(0)) is not True or s.scale != 16.0:
                raise Fail(f"clean: scale {s.scale}")
            if s.update(mk(1)) is not False or s.scale != 8.0:
                raise Fail(f"overflow: scale {s.scale}")
    with c.sub("the flag unscale_ returns for a 1-element found_inf, straight into update()"):
        s = amp.DynamicLossScaler(init_scale=8.0)
        f = s.unscale_([dev(np.ones(4, np.float32))], found_inf=cp.zeros(1, np.int32))
        if s.update(f) is not True:
            raise Fail("clean step reported as overflow")
    with c.sub("state_dict round trip, then the same policy"):
        a = amp.DynamicLossScaler(init_scale=64.0, growth_interval=3)
        for f in (0, 0, 1, 0, 0):
            a.update(f)
        b = amp.DynamicLossScaler(init_scale=64.0, growth_interval=3)
        b.load_state_dict(a.state_dict())
        for f in (0, 1, 0, 0, 0):
            if a.update(f) != b.update(f) or a.scale != b.scale or a.growth_tracker != b.growth_tracker:
                raise Fail(f"diverged: {a.state_dict()} vs {b.state_dict()}")


@check("scaler_constructor_validation")
def _(c):
    for kw in (dict(init_scale=0), dict(init_scale=-1.0), dict(init_scale=float("nan")), dict(init_scale=float("inf")),
               dict(growth_factor=1.0), dict(growth_factor=0.5), dict(growth_factor=float("nan")),
               dict(backoff_factor=0.0), dict(backoff_factor=1.0), dict(backoff_factor=float("nan")),
               dict(growth_interval=0), dict(growth_interval=-5)):
        with c.sub(f"{kw}: ValueError (documented)"):
            expect_error(str(kw), ValueError, [list(kw)[0]], amp.DynamicLossScaler, **kw)
    for kw in (dict(growth_interval="10"), dict(growth_interval=2.5), dict(init_scale="1024"),
               dict(growth_factor=None)):
        with c.sub(f"{kw}: TypeError (README: types raise TypeError)"):
            expect_error(str(kw), TypeError, [list(kw)[0]], amp.DynamicLossScaler, **kw)


@check("scaler_clamp_and_bounds_undocumented")
def _(c):
    with c.sub("init_scale above max_scale: 'min_scale/max_scale clamp it' from the start"):
        s = amp.DynamicLossScaler(init_scale=2.0 ** 16, max_scale=1024.0)
        if s.scale > 1024.0:
            raise Fail(f"scale {s.scale} before the first update (the first step runs above max_scale)")
    with c.sub("min_scale > max_scale rejected"):
        expect_error("min > max", ValueError, ["min_scale|max_scale"], amp.DynamicLossScaler, min_scale=8.0,
                     max_scale=2.0)
    with c.sub("growth_factor=inf rejected (scale would become inf, inv_scale 0)"):
        expect_error("inf", ValueError, ["growth_factor"], amp.DynamicLossScaler, growth_factor=float("inf"))


@check("optim_bad_input_raises_before_launch")
def _(c):
    n = 8
    ph = np.arange(n, dtype=np.float32) + 0.5

    def arrs():
        return dict(m=dev(ph), g=dev(np.ones(n, np.float16)), b=dev(ph * 2), e1=dev(ph * 3), e2=dev(ph * 4),
                    mod=nan_like(n, BF16))

    def run(label, exc, words, fn):
        with c.sub(label):
            a = arrs()
            expect_error(label, exc, words, fn, a)
            for k, v in (("m", ph), ("b", ph * 2), ("e1", ph * 3), ("e2", ph * 4)):
                same_bits(f"{k} untouched", a[k], v.astype(np.float32))
            if not np.isnan(hst(a["mod"]).astype(np.float32)).all():
                raise Fail("model written")

    def sgd(**over):
        def f(a):
            args = dict(master=a["m"], grad=a["g"], momentum_buf=a["b"], model=a["mod"])
            kw = dict(lr=0.1)
            for k, v in over.items():
                (args if k in args else kw)[k] = v(a) if callable(v) else v
            return amp.sgd_momentum_step(args["master"], args["grad"], args["momentum_buf"], args["model"], **kw)
        return f

    def adamw(**over):
        def f(a):
            args = dict(master=a["m"], grad=a["g"], exp_avg=a["e1"], exp_avg_sq=a["e2"], model=a["mod"])
            kw = dict(lr=1e-3, step=1)
            for k, v in over.items():
                (args if k in args else kw)[k] = v(a) if callable(v) else v
            return amp.adamw_step(args["master"], args["grad"], args["exp_avg"], args["exp_avg_sq"], args["model"],
                                  **kw)
        return f

    T, V = TypeError, ValueError
    cases = [
        ("sgd master NumPy", T, ["master", "CuPy"], sgd(master=lambda a: ph.copy())),
        ("sgd master float16", T, ["master", "float32"], sgd(master=lambda a: cp.ones(n, np.float16))),
        ("sgd master float64", T, ["master", "float32"], sgd(master=lambda a: cp.ones(n, np.float64))),
        ("sgd master int32", T, ["master"], sgd(master=lambda a: cp.ones(n, np.int32))),
        ("sgd grad int32", T, ["grad", "int32"], sgd(grad=lambda a: cp.ones(n, np.int32))),
        ("sgd grad float64", T, ["grad", "float64"], sgd(grad=lambda a: cp.ones(n, np.float64))),
        ("sgd grad NumPy", T, ["grad", "CuPy"], sgd(grad=np.ones(n, np.float32))),
        ("sgd grad None", T, ["grad"], sgd(grad=None)),
        ("sgd momentum_buf bfloat16", T, ["momentum_buf", "float32"], sgd(momentum_buf=lambda a: nan_like(n, BF16))),
        ("sgd momentum_buf int32", T, ["momentum_buf"], sgd(momentum_buf=lambda a: cp.ones(n, np.int32))),
        ("sgd momentum_buf None", T, ["momentum_buf"], sgd(momentum_buf=None)),
        ("sgd model int8", T, ["model"], sgd(model=lambda a: cp.ones(n, np.int8))),
        ("sgd model float64", T, ["model", "float64"], sgd(model=lambda a: cp.ones(n, np.float64))),
        ("sgd model NumPy", T, ["model", "CuPy"], sgd(model=np.ones(n, np.float16))),
        ("sgd grad shape (9,)", V, ["grad", "shape"], sgd(grad=lambda a: cp.ones(9, np.float16))),
        ("sgd grad shape (2, 4)", V, ["grad", "shape"], sgd(grad=lambda a: cp.ones((2, 4), np.float16))),
        ("sgd momentum_buf shape (4, 2)", V, ["momentum_buf", "shape"],
         sgd(momentum_buf=lambda a: cp.ones((4, 2), np.float32))),
        ("sgd model shape (7,)", V, ["model", "shape"], sgd(model=lambda a: cp.ones(7, np.float16))),
        ("sgd grad strided", V, ["grad", "contiguous"], sgd(grad=lambda a: cp.ones(2 * n, np.float16)[::2])),
        ("sgd momentum_buf strided", V, ["momentum_buf", "contiguous"],
         sgd(momentum_buf=lambda a: cp.ones(2 * n, np.float32)[::2])),
        ("sgd model strided", V, ["model", "contiguous"], sgd(model=lambda a: cp.ones(2 * n, np.float16)[::2])),
        ("sgd found_inf float32", V, ["found_inf"], sgd(found_inf=lambda a: cp.zeros((), np.float32))),
        ("sgd found_inf bool", V, ["found_inf"], sgd(found_inf=lambda a: cp.zeros((), np.bool_))),
        ("sgd found_inf 2 elements", V, ["found_inf"], sgd(found_inf=lambda a: cp.zeros(2, np.int32))),
        ("sgd found_inf NumPy", T, ["found_inf"], sgd(found_inf=np.zeros((), np.int32))),
        ("sgd found_inf Python int", T, ["found_inf"], sgd(found_inf=1)),
        ("sgd lr NaN", V, ["lr"], sgd(lr=float("nan"))),
        ("sgd lr negative", V, ["lr"], sgd(lr=-1e-3)),
        ("sgd lr 1e39", V, ["lr"], sgd(lr=1e39)),
        ("sgd momentum NaN", V, ["momentum"], sgd(momentum=float("nan"))),
        ("sgd weight_decay inf", V, ["weight_decay"], sgd(weight_decay=float("inf"))),
        ("sgd dampening NaN", V, ["dampening"], sgd(dampening=float("nan"))),
        ("sgd nesterov with dampening", V, ["nesterov"], sgd(nesterov=True, dampening=0.1)),
        ("sgd nesterov=2", T, ["nesterov"], sgd(nesterov=2)),
        ("sgd first_step='yes'", T, ["first_step"], sgd(first_step="yes")),
        ("sgd inv_scale NaN", V, ["inv_scale"], sgd(inv_scale=float("nan"))),
        ("sgd maximize (not offered)", T, ["maximize"], sgd(maximize=True)),
        ("adamw master float16", T, ["master", "float32"], adamw(master=lambda a: cp.ones(n, np.float16))),
        ("adamw exp_avg float16", T, ["exp_avg", "float32"], adamw(exp_avg=lambda a: cp.ones(n, np.float16))),
        ("adamw exp_avg_sq bfloat16", T, ["exp_avg_sq", "float32"], adamw(exp_avg_sq=lambda a: nan_like(n, BF16))),
        ("adamw exp_avg_sq float64", T, ["exp_avg_sq"], adamw(exp_avg_sq=lambda a: cp.ones(n, np.float64))),
        ("adamw exp_avg None", T, ["exp_avg"], adamw(exp_avg=None)),
        ("adamw grad int16", T, ["grad"], adamw(grad=lambda a: cp.ones(n, np.int16))),
        ("adamw exp_avg shape (9,)", V, ["exp_avg", "shape"], adamw(exp_avg=lambda a: cp.ones(9, np.float32))),
        ("adamw exp_avg_sq shape (1, 8)", V, ["exp_avg_sq", "shape"],
         adamw(exp_avg_sq=lambda a: cp.ones((1, n), np.float32))),
        ("adamw master transposed", V, ["master|contiguous"],
         adamw(master=lambda a: cp.ones((4, 2), np.float32).T, grad=lambda a: cp.ones((2, 4), np.float16),
               exp_avg=lambda a: cp.ones((2, 4), np.float32), exp_avg_sq=lambda a: cp.ones((2, 4), np.float32),
               model=None)),
        ("adamw step 0", V, ["step"], adamw(step=0)),
        ("adamw step -3", V, ["step"], adamw(step=-3)),
        ("adamw step 1.0", T, ["step"], adamw(step=1.0)),
        ("adamw step True", T, ["step"], adamw(step=True)),
        ("adamw step a CuPy 0-d", T, ["step"], adamw(step=lambda a: cp.asarray(1))),
        ("adamw betas (0.9,)", T, ["betas"], adamw(betas=(0.9,))),
        ("adamw betas (0.9, 1.0)", V, ["betas"], adamw(betas=(0.9, 1.0))),
        ("adamw betas ('a', 0.9)", T, ["betas"], adamw(betas=("a", 0.9))),
        ("adamw betas NaN", V, ["betas"], adamw(betas=(float("nan"), 0.9))),
        ("adamw eps NaN", V, ["eps"], adamw(eps=float("nan"))),
        ("adamw lr negative", V, ["lr"], adamw(lr=-1.0)),
        ("adamw weight_decay negative", V, ["weight_decay"], adamw(weight_decay=-0.1)),
        ("adamw found_inf int64", V, ["found_inf"], adamw(found_inf=lambda a: cp.zeros(1, np.int64))),
        ("adamw amsgrad (not offered)", T, ["amsgrad"], adamw(amsgrad=True)),
        ("adamw maximize (not offered)", T, ["maximize"], adamw(maximize=True)),
    ]
    if torch is not None:
        cases.append(("sgd master a torch tensor", T, ["master", "CuPy"],
                      sgd(master=lambda a: torch.ones(n, device=TDEV))))
    for label, exc, words, fn in cases:
        run(label, exc, words, fn)
    with c.sub("empty master with a bad grad dtype still raises"):
        expect_error("empty", TypeError, ["grad"], amp.sgd_momentum_step, cp.ones(0, np.float32),
                     cp.ones(0, np.int32), cp.ones(0, np.float32), lr=0.1)


@check("optim_hyperparameter_edges")
def _(c):
    rng = rng_for(c.name)
    n = 3001
    p0 = rng.standard_normal(n).astype(np.float32)
    g = rnd(rng.standard_normal(n) * 8, F16)
    base = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=1e-2, nesterov=False)
    with c.sub("sgd lr=0: master bit for bit, model written, buffer = g"):
        m, b, mod = dev(p0), nan_like(n, F32), nan_like(n, F16)
        amp.sgd_momentum_step(m, dev(g), b, mod, first_step=True, **{**base, "lr": 0.0})
        same_bits("master", m, p0)
        same_bits("model", mod, p0.astype(F16))
        close("buf", b, g.astype(np.float64) + 1e-2 * p0.astype(np.float64), None)
    for inv in (0.0, -1.0 / 512, 3.0e-8):
        with c.sub(f"sgd inv_scale={inv} (the documented g = grad * inv_scale)"):
            m, b = dev(p0), nan_like(n, F32)
            amp.sgd_momentum_step(m, dev(g), b, first_step=True, inv_scale=inv, **base)
            r64, b64 = sgd_ref(p0.astype(np.float64), np.zeros(n), g, base, True, inv, F64)
            r32, b32 = sgd_ref(p0.copy(), np.zeros(n, np.float32), g, base, True, inv, F32)
            close("master", m, r64, r32)
            close("buf", b, b64, b32)
    ca = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    with c.sub("adamw step as np.int64 / int and betas as list / tuple / np.float64: same bits"):
        outs = []
        for step, betas in ((7, (0.9, 0.999)), (np.int64(7), [0.9, 0.999]), (np.int32(7), (np.float64(0.9), 0.999))):
            m = dev(p0)
            amp.adamw_step(m, dev(g), dev(np.full(n, 0.01, np.float32)), dev(np.full(n, 1e-3, np.float32)), lr=1e-2,
                           step=step, betas=betas)
            outs.append(hst(m))
        for o in outs[1:]:
            same_bits("variant", o, outs[0])
    with c.sub("adamw step=10**9 (bias corrections 1) vs float64"):
        m, e1, e2 = dev(p0), dev(np.zeros(n, np.float32)), dev(np.zeros(n, np.float32))
        amp.adamw_step(m, dev(g), e1, e2, step=10 ** 9, **ca)
        r64 = adamw_ref(p0.astype(np.float64), np.zeros(n), np.zeros(n), g, ca, 10 ** 9, 1.0, F64)
        r32 = adamw_ref(p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32), g, ca, 10 ** 9, 1.0, F32)
        close("master", m, r64[0], r32[0])
    with c.sub("adamw lr * weight_decay > 1 (decay factor negative, as torch) vs float64"):
        cc = dict(lr=2.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.75)
        m, e1, e2 = dev(p0), dev(np.zeros(n, np.float32)), dev(np.zeros(n, np.float32))
        amp.adamw_step(m, dev(g), e1, e2, step=1, **cc)
        r64 = adamw_ref(p0.astype(np.float64), np.zeros(n), np.zeros(n), g, cc, 1, 1.0, F64)
        r32 = adamw_ref(p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32), g, cc, 1, 1.0, F32)
        close("master", m, r64[0], r32[0])
    with c.sub("adamw eps=0 with zero gradients and zero state: NaN as torch (0/0)"):
        need_torch()
        z = np.zeros(n, np.float32)
        cc = dict(lr=1e-2, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0)
        m = dev(p0)
        amp.adamw_step(m, dev(z), dev(z), dev(z), step=1, **cc)
        tp = torch_opt("adamw", p0, [z], cc, 1.0, "foreach")[0]
        if not np.array_equal(np.isnan(f64(m)), np.isnan(tp)):
            raise Fail(f"NaN count {int(np.isnan(f64(m)).sum())}, torch {int(np.isnan(tp).sum())}")
    with c.sub("adamw beta1 = 0 and beta2 = 0 (allowed by torch) vs float64"):
        cc = dict(lr=1e-2, betas=(0.0, 0.0), eps=1e-8, weight_decay=0.0)
        m, e1, e2 = dev(p0), dev(np.zeros(n, np.float32)), dev(np.zeros(n, np.float32))
        amp.adamw_step(m, dev(g), e1, e2, step=1, **cc)
        r64 = adamw_ref(p0.astype(np.float64), np.zeros(n), np.zeros(n), g, cc, 1, 1.0, F64)
        r32 = adamw_ref(p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32), g, cc, 1, 1.0, F32)
        close("master", m, r64[0], r32[0])


@check("sgd_tiny_momentum_underflows_float32")
def _(c):
    """momentum=1e-46 passes validation (> 0, finite) but is 0 in float32: torch still keeps a buffer (buf = g on
    the first step, as the docstring says); does cuflash?"""
    rng = rng_for(c.name)
    n = 100
    g = rng.standard_normal(n).astype(np.float32)
    with c.sub("first step, momentum=1e-46, nesterov=True"):
        b = nan_like(n, F32)
        amp.sgd_momentum_step(dev(np.zeros(n, np.float32)), dev(g), b, lr=0.1, momentum=1e-46, nesterov=True,
                              first_step=True)
        if np.isnan(hst(b)).any():
            raise Fail("momentum_buf not written (documented: buf = g on the first step); the kernel takes "
                       "momentum == 0.f after the float32 cast")


@check("optim_shapes_empty_0d_2d_large")
def _(c):
    rng = rng_for(c.name)
    cfg = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=1e-2, nesterov=True)
    ca = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    for sh, gdt, mdt in (((), F16, BF16), ((0,), BF16, F16), ((0, 5), F32, None), ((33, 65), BF16, F16),
                         ((BIG,), F32, BF16), ((1,), F16, F32), ((3, 1, 5), BF16, BF16)):
        with c.sub(f"shape {sh} grad {gdt} model {mdt}"):
            p0 = np.asarray(rng.standard_normal(sh), np.float32)
            g = rnd(rng.standard_normal(sh) * 100, gdt)
            m, b = dev(p0), nan_like(sh, F32)
            mod = None if mdt is None else nan_like(sh, mdt)
            r = amp.sgd_momentum_step(m, dev(g), b, mod, first_step=True, inv_scale=0.01, **cfg)
            if r is not m:
                raise Fail(f"returned {desc(r)}")
            r64, _ = sgd_ref(p0.astype(np.float64), None, g, cfg, True, 0.01, F64)
            r32, _ = sgd_ref(p0.copy(), None, g, cfg, True, 0.01, F32)
            close("sgd master", m, r64, r32)
            if mod is not None:
                same_bits("sgd model", mod, hst(m).astype(mdt))
            m2, e1, e2 = dev(p0), dev(np.zeros(sh, np.float32)), dev(np.zeros(sh, np.float32))
            mod2 = None if mdt is None else nan_like(sh, mdt)
            r = amp.adamw_step(m2, dev(g), e1, e2, mod2, step=1, inv_scale=0.01, **ca)
            if r is not m2:
                raise Fail(f"adamw returned {desc(r)}")
            a64 = adamw_ref(p0.astype(np.float64), np.zeros(sh), np.zeros(sh), g, ca, 1, 0.01, F64)
            a32 = adamw_ref(p0.copy(), np.zeros(sh, np.float32), np.zeros(sh, np.float32), g, ca, 1, 0.01, F32)
            close("adamw master", m2, a64[0], a32[0])
            if mod2 is not None:
                same_bits("adamw model", mod2, hst(m2).astype(mdt))


@check("optim_aliasing_undocumented")
def _(c):
    """Docs are silent. Well defined per element (read before write in one thread): model is master (float32),
    grad is master. Two outputs in one array (momentum_buf is master, exp_avg is exp_avg_sq) cannot both hold their
    documented value: expected ValueError."""
    rng = rng_for(c.name)
    n = 5000
    p0 = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    cfg = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False)
    with c.sub("model is master (float32)"):
        m = dev(p0)
        amp.sgd_momentum_step(m, dev(g), nan_like(n, F32), m, first_step=True, **cfg)
        r64, _ = sgd_ref(p0.astype(np.float64), None, g, cfg, True, 1.0, F64)
        r32, _ = sgd_ref(p0.copy(), None, g, cfg, True, 1.0, F32)
        close("master", m, r64, r32)
    with c.sub("grad is master (float32)"):
        m = dev(p0)
        amp.sgd_momentum_step(m, m, nan_like(n, F32), first_step=True, **cfg)
        r64, _ = sgd_ref(p0.astype(np.float64), None, p0, cfg, True, 1.0, F64)
        r32, _ = sgd_ref(p0.copy(), None, p0, cfg, True, 1.0, F32)
        close("master", m, r64, r32)
    with c.sub("momentum_buf is master: rejected?"):
        m = dev(p0)
        try:
            amp.sgd_momentum_step(m, dev(g), m, first_step=True, **cfg)
        except ValueError:
            pass
        else:
            raise Fail("accepted: the buffer and the weights overwrite each other (the array holds the weights, "
                       "the buffer is lost)")
    with c.sub("exp_avg is exp_avg_sq: rejected?"):
        e = dev(np.zeros(n, np.float32))
        try:
            amp.adamw_step(dev(p0), dev(g), e, e, lr=1e-2, step=1)
        except ValueError:
            pass
        else:
            raise Fail("accepted: both moments written to one array")


@check("determinism_bitwise_undocumented")
def _(c):
    rng = rng_for(c.name)
    n = BIG
    p0 = rng.standard_normal(n).astype(np.float32)
    g = rnd(rng.standard_normal(n) * 100, BF16)
    with c.sub("unscale twice"):
        outs = []
        for _ in range(2):
            d = [dev(g), dev(p0)]
            amp.unscale_and_check(d, 1 / 3.0)
            outs.append([hst(x) for x in d])
        for a, b in zip(*outs):
            same_bits("repeat", a, b)
    with c.sub("sgd and adamw twice from the same state"):
        outs = []
        for _ in range(2):
            m, b = dev(p0), dev(p0 * 0.5)
            amp.sgd_momentum_step(m, dev(g), b, lr=0.1, nesterov=True, weight_decay=1e-2, inv_scale=0.01)
            m2, e1, e2 = dev(p0), dev(np.abs(p0) * 0.1), dev(np.abs(p0) * 0.01)
            amp.adamw_step(m2, dev(g), e1, e2, lr=1e-2, step=3, inv_scale=0.01)
            outs.append([hst(x) for x in (m, b, m2, e1, e2)])
        for a, b in zip(*outs):
            same_bits("repeat", a, b)


# ------------------------------------------------------------------------------------------------------------
# asynchronous hazards of the cached pointer table (last: a fault here could poison the context)
@check("unscale_table_cache_eviction_with_busy_stream", device_timing=True)
def _(c):
    """More distinct lists than the table cache holds (64), issued while the stream is still busy (the host runs
    ahead of the GPU, as in any training loop). Each table is copied from a pinned host buffer asynchronously; an
    evicted entry frees its pinned buffer while its copy may not have run yet."""
    rng = rng_for(c.name)
    N = 80
    s = cp.cuda.Stream(non_blocking=True)
    host = [rng.integers(1, 1000, 37).astype(np.float32) for _ in range(N)]  # 37: a size no other check uses
    d = [dev(h) for h in host]
    flag = cp.zeros((), np.int32)
    sync()
    with c.sub(f"{N} single-tensor lists behind a 300 ms kernel"):
        with s:
            spin(300)
            for x in d:
                amp.unscale_and_check([x], 0.5, found_inf=flag)
            busy = not s.done
        s.synchronize()
        res = []
        for i, (h, x) in enumerate(zip(host, d)):
            o = hst(x)
            res.append("ok" if np.array_equal(o, h * 0.5) else "none" if np.array_equal(o, h) else
                       "twice" if np.array_equal(o, h * 0.25) else "other")
        bad = [(i, r) for i, r in enumerate(res) if r != "ok"]
        if bad:
            raise Fail(f"{len(bad)} of {N} lists wrong (stream still busy after the calls: {busy}): "
                       f"{', '.join(f'list {i} {r}' for i, r in bad[:24])}{' ...' if len(bad) > 24 else ''}")


@check("unscale_table_cache_cross_stream", device_timing=True)
def _(c):
    """The same list unscaled on stream 1 (table miss: its copy queued behind a busy kernel) and right after on
    stream 2 (table hit). The table's device memory starts uninitialised (cupy.empty): the test has the pool hand it
    out pre-filled with a table naming a decoy array, so a kernel that runs before the copy lands is visible
    (the decoy changes) instead of reading garbage pointers."""
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    n = 41
    L = dev(np.full(n, 8.0, np.float32))
    decoy = dev(np.full(n, 8.0, np.float32))
    flag = cp.zeros((), np.int32)
    pool = cp.get_default_memory_pool()
    with s1:
        bait = cp.asarray(np.array([decoy.data.ptr, n, 0], np.int64))
    s1.synchronize()
    sync()
    used = []
    prev = cp.cuda.get_allocator()

    def hook(size):
        if not used and 0 < size <= 512:
            used.append(size)
            return bait.data
        return pool.malloc(size)

    with c.sub("stream 1 (busy) then stream 2, same list"):
        with s1:
            spin(200)
            cp.cuda.set_allocator(hook)
            try:
                amp.unscale_and_check([L], 0.5, found_inf=flag)
            finally:
                cp.cuda.set_allocator(prev)
        with s2:
            amp.unscale_and_check([L], 0.5, found_inf=flag)
        s2.synchronize()
        s1.synchronize()
        lv, dv = float(hst(L)[0]), float(hst(decoy)[0])
        if not used:
            raise Skip("the table was not allocated through the allocator hook (cached already?)")
        if lv != 2.0 or dv != 8.0:
            raise Fail(f"list unscaled to {lv} (expected 2.0 = 8 * 0.5 * 0.5), decoy {dv} (expected 8.0): the "
                       "stream-2 launch read the cached table before stream 1's copy of it had run")


# ------------------------------------------------------------------------------------------------------------
ORDER = ["doc_typical_loop_as_written", "unscale_mixed_sizes_dtypes_vs_numpy_and_torch",
         "unscale_nonfinite_in_one_of_many", "unscale_found_inf_forms_and_write_false", "unscale_inv_scale_edges",
         "unscale_bad_input_raises_before_launch", "optim_bad_input_raises_before_launch",
         "scaler_constructor_validation", "scaler_update_flag_forms", "sgd_multistep_vs_float64_and_torch",
         "adamw_multistep_vs_float64_and_torch", "optim_found_inf_skips_whole_step_no_partial_update",
         "scaler_loop_vs_torch_gradscaler_sgd", "scaler_loop_vs_torch_gradscaler_adamw",
         "doc_loop_fused_variant_literal_order", "doc_loop_variants_agree_fp16_small_grads",
         "scaler_policy_vs_torch_amp_update_scale", "unscale_subnormal_and_huge_grads",
         "optim_hyperparameter_edges", "optim_shapes_empty_0d_2d_large", "unscale_table_cache_lists_of_same_shapes",
         "optim_and_unscale_on_nondefault_stream", "unscale_alias_same_array_twice_undocumented",
         "optim_aliasing_undocumented", "sgd_tiny_momentum_underflows_float32", "scaler_clamp_and_bounds_undocumented",
         "determinism_bitwise_undocumented", "unscale_table_cache_eviction_with_busy_stream",
         "unscale_table_cache_cross_stream"]


def main():
    if "--list" in sys.argv:
        for name, _f_, tn, dtm in CHECKS:
            print(name + ("  (torch)" if tn else "") + ("  (device timing)" if dtm else ""))
        return 0
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    try:
        gpu = gpu_name(cp)
    except Exception as e:
        gpu = f"? ({_exc_text(e)})"
    print(f"# newuser_amp_probe: GPU {gpu}; cupy {cp.__version__}, numpy {np.__version__}, ml_dtypes "
          f"{ml_dtypes.__version__}, torch {torch.__version__ if torch is not None else TORCH_WHY} on {TDEV}; "
          f"budget {BUDGET:.0f} s", flush=True)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    state = {"name": None, "t": time.time()}
    start_watchdog(T0, HARD, state, counts, period=0.5)
    rank = {n: i for i, n in enumerate(ORDER)}
    for name, f, torch_needed, device_timing in sorted(CHECKS, key=lambda t: rank.get(t[0], len(ORDER))):
        if only and not any(s in name for s in only):
            continue
        if time.time() - T0 > BUDGET:
            print(f"SKIP {name}: time budget of {BUDGET:.0f} s spent (PROBE_BUDGET_S)", flush=True)
            counts["SKIP"] += 1
            continue
        if torch_needed and torch is None:
            print(f"SKIP {name}: {TORCH_WHY}", flush=True)
            counts["SKIP"] += 1
            continue
        if device_timing and DRYRUN:
            print(f"SKIP {name}: needs a real device (PROBE_DRYRUN)", flush=True)
            counts["SKIP"] += 1
            continue
        c = Check(name)
        state["name"], state["t"] = name, time.time()
        try:
            f(c)
        except Skip as e:
            print(f"SKIP {name}: {e}", flush=True)
            counts["SKIP"] += 1
            continue
        except Fail as e:
            c.fails.append(str(e))
        except Exception as e:
            c.fails.append(f"unexpected {_exc_text(e)}")
        try:
            sync()  # an asynchronous kernel fault surfaces here
        except Exception as e:
            c.fails.append(f"device error after the check: {_exc_text(e)}")
        dt = time.time() - state["t"]
        skipped = f"; {len(c.skips)} skipped: " + " | ".join(c.skips) if c.skips else ""
        if c.fails:
            counts["FAIL"] += 1
            print(f"FAIL {name}: " + " | ".join(c.fails) + f"  [{len(c.fails)} of {c.steps} steps failed{skipped}, "
                  f"{dt:.1f} s]", flush=True)
        elif c.skips and len(c.skips) >= c.steps:
            counts["SKIP"] += 1
            print(f"SKIP {name}: " + " | ".join(c.skips) + f"  [{dt:.1f} s]", flush=True)
        else:
            counts["PASS"] += 1
            print(f"PASS {name}  [{c.steps} steps{skipped}, {dt:.1f} s]", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    total = sum(counts.values())
    print(f"SUMMARY: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped of {total} checks "
          f"in {time.time() - T0:.1f} s", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
