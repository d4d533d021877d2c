"""Mixed-precision training kernels: multi-tensor unscale-and-check, dynamic loss scaling, fused optimizer steps.

The recipe is Micikevicius et al., *Mixed Precision Training* (ICLR 2018): keep float32 *master* weights (an
update smaller than half an ulp of a float16 weight would vanish), compute in float16/bfloat16, and multiply the
loss by a scale ``S`` so that small gradients do not underflow float16; divide the gradients by ``S`` before the
update and skip the step (and lower ``S``) when any gradient overflowed. Dynamic scaling raises ``S`` again
after a run of clean steps (the policy of ``torch.amp.GradScaler``: initial 2^16, x2 after 2000 clean steps,
x0.5 on overflow).

Kernels (``cuda_src/amp.cu``):

* :func:`unscale_and_check` — ONE launch over a list of gradient tensors of one dtype (one launch per dtype in
  the list): ``g *= inv_scale`` in place and a device int32 flag set to 1 when any element is inf/NaN. The
  pointer/size table lives on the device (cached per list, so a training loop copies it once); the flag comes
  back as a 0-d CuPy int32 array and nothing here synchronises with the host.
* :func:`sgd_momentum_step`, :func:`adamw_step` — one pass that reads the gradient (fp32/fp16/bf16, scaled by
  ``inv_scale``), the fp32 master weights and fp32 optimizer state, and writes the master, the state and the
  low-precision model copy. A device ``found_inf`` flag can be passed to skip the step on the device.
* :class:`DynamicLossScaler` — the host-side policy; :meth:`DynamicLossScaler.update` reads the flag (the one
  host synchronisation of a step).
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from . import _compile, _dtypes
from ._attn_common import as_bool, as_float, as_int
from . import numerics as _numerics  # noqa: F401  (declares the reduction-study kernels at import)

SOURCE = "amp.cu"
GRAD_DTYPES = (_dtypes.float32, _dtypes.float16, _dtypes.bfloat16)
MODEL_DTYPES = (_dtypes.float16, _dtypes.bfloat16, _dtypes.float32)
_BLOCK = 256

_UNSCALE = {dt: f"unscale_and_check<{_dtypes.ctype(dt)}>" for dt in GRAD_DTYPES}
# Model copy "None" is launched with M = float and a null pointer.
_SGD = {(g, m): f"sgd_momentum_step<{_dtypes.ctype(g)}, {_dtypes.ctype(m)}>" for g in GRAD_DTYPES
        for m in MODEL_DTYPES}
_ADAMW = {(g, m): f"adamw_step<{_dtypes.ctype(g)}, {_dtypes.ctype(m)}>" for g in GRAD_DTYPES for m in MODEL_DTYPES}
_compile.declare(SOURCE, list(_UNSCALE.values()) + list(_SGD.values()) + list(_ADAMW.values()))

_NULL = np.uintp(0)


def _cupy():
    import cupy

    return cupy


def _require_cupy(x, name):
    cupy = _cupy()
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a CuPy array, got {type(x).__name__}")
    return x


def _grid(n: int, per_thread: int = 1) -> int:
    dev = _cupy().cuda.runtime.getDevice()
    want = -(-max(n, 1) // (_BLOCK * per_thread))
    return int(max(1, min(want, _compile.sm_count(dev) * 8)))


# ----------------------------------------------------------------------------------------------------------
# unscale_and_check
_TABLES: "OrderedDict[tuple, object]" = OrderedDict()
_TABLES_MAX = 64


def _table(group):
    """Device int64 table [ptrs | sizes | offsets] for a list of arrays (cached: same list -> no copy).

    The table's copy runs on the stream current when it was made; a later launch from the cache, on any stream,
    first makes its stream wait for that copy's event (no host synchronisation), and a table dropped from the
    cache waits for its copy before its pinned staging buffer is freed (it could otherwise be handed to the next
    table while the copy still reads it)."""
    cupy = _cupy()
    key = (cupy.cuda.runtime.getDevice(),) + tuple((g.data.ptr, g.size) for g in group)
    t = _TABLES.get(key)
    if t is not None:
        _TABLES.move_to_end(key)
        cupy.cuda.get_current_stream().wait_event(t[2])
        return t[0]
    sizes = np.array([g.size for g in group], dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    host = np.concatenate([np.array([g.data.ptr for g in group], dtype=np.int64), sizes, offs])
    # pinned staging + async copy on the current stream: no host synchronisation even on a cache miss
    import cupyx

    pinned = cupyx.empty_pinned(host.shape, dtype=np.int64)
    pinned[...] = host
    dev_t = cupy.empty(host.shape, dtype=np.int64)
    stream = cupy.cuda.get_current_stream()
    dev_t.set(pinned, stream=stream)
    copied = cupy.cuda.Event(block=False, disable_timing=True)
    copied.record(stream)
    _TABLES[key] = (dev_t, pinned, copied)  # the pinned buffer lives until its copy is done (copied)
    if len(_TABLES) > _TABLES_MAX:
        _TABLES.popitem(last=False)[1][2].synchronize()  # the oldest table's copy: long done in a loop
    return dev_t


def _no_overlap(named):
    """ValueError when two of the (name, C-contiguous array) pairs share memory: the kernels update each element
    from one thread and take their pointers as ``__restrict__`` (the same array twice was scaled twice, or its
    update lost)."""
    spans = sorted((a.data.ptr, a.data.ptr + a.nbytes, name) for name, a in named if a.size)
    for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise ValueError(f"{n0} and {n1} share memory; every array must be a separate buffer")


def _check_grad_list(grads, what="grads"):
    if not isinstance(grads, (list, tuple)):
        grads = [grads]
    cupy = _cupy()
    for i, g in enumerate(grads):
        if not isinstance(g, cupy.ndarray):
            raise TypeError(f"{what}[{i}] must be a CuPy array, got {type(g).__name__}")
        _dtypes.check_dtype(g.dtype, GRAD_DTYPES, f"{what}[{i}]")
        if g.size and not g.flags.c_contiguous:
            raise ValueError(f"{what}[{i}] (shape {g.shape}, strides {g.strides}) must be C-contiguous: "
                             "it is updated in place")
    return list(grads)


def unscale_and_check(grads, inv_scale, found_inf=None, *, write: bool = True):
    """Multiply every gradient by ``inv_scale`` in place and flag any inf/NaN, in one launch per dtype.

    The unscale and overflow check of loss scaling (Micikevicius et al. 2018, Sec. 3.2): a flagged step is
    skipped and the scale lowered (:class:`DynamicLossScaler`).

    Parameters
    ----------
    grads : CuPy array or list of CuPy arrays, C-contiguous, float32/float16/bfloat16, any shapes.
    inv_scale : float, 1/loss_scale (passed to the kernel as float32; 0, or at least float32's smallest normal
        number 1.2e-38: the kernels, compiled with flush-to-zero as CuPy compiles every kernel, read a subnormal
        one as 0, and likewise flush subnormal gradients and products to 0).
    found_inf : optional 0-d (or 1-element) int32 CuPy array to OR the result into (as torch's
        ``_amp_foreach_non_finite_check_and_unscale_``); a fresh zero flag otherwise.
    write : False checks only (no stores), e.g. when the fused optimizer step unscales.

    Returns the int32 flag array (device; 1 if any element of any tensor was inf or NaN before unscaling;
    ``found_inf`` itself when given). No host synchronisation.

    Raises
    ------
    TypeError : a gradient or ``found_inf`` not a CuPy array; a gradient not float32/float16/bfloat16.
    ValueError : a non-empty gradient that is not C-contiguous; ``found_inf`` not int32 or not of one element
        (a wrong dtype is a ValueError here); ``inv_scale`` NaN, infinite or beyond float32's range. All before
        any launch (``inv_scale`` not a real number or ``write`` not a bool: TypeError).
    """
    cupy = _cupy()
    inv = np.float32(_inv_scale(inv_scale))
    write = as_bool(write, "write")
    grads = _check_grad_list(grads)
    if found_inf is None:
        found_inf = cupy.zeros((), dtype=np.int32)
    else:
        _require_cupy(found_inf, "found_inf")
        if found_inf.dtype != np.int32 or found_inf.size != 1:
            raise ValueError(f"found_inf must be a 1-element int32 CuPy array, got {found_inf.dtype} "
                             f"shape {found_inf.shape}")
    _no_overlap([(f"grads[{i}]", g) for i, g in enumerate(grads)])
    groups: dict = {}
    for g in grads:
        if g.size:
            groups.setdefault(g.dtype, []).append(g)
    for dt, group in groups.items():
        table = _table(group)
        total = sum(g.size for g in group)
        k = _compile.get_kernel(SOURCE, _UNSCALE[dt])
        _compile.launch(k, (_grid(total, 4),), (_BLOCK,),
                        (table, np.int32(len(group)), inv, np.int32(bool(write)), found_inf))
    return found_inf


def check_finite(grads, found_inf=None):
    """Flag (device int32, 1 = found) any inf/NaN in a list of tensors without modifying them.

    :func:`unscale_and_check` with ``inv_scale=1`` and ``write=False`` (the overflow check of Micikevicius et
    al. 2018, Sec. 3.2, for fused steps that unscale themselves): same arguments and flag.

    Raises
    ------
    TypeError : a tensor or ``found_inf`` not a CuPy array; a tensor not float32/float16/bfloat16.
    ValueError : a non-empty tensor that is not C-contiguous; ``found_inf`` not int32 or not of one element. All
        before any launch.
    """
    return unscale_and_check(grads, 1.0, found_inf, write=False)


# ----------------------------------------------------------------------------------------------------------
# Fused optimizer steps
def _check_param_set(master, grad, states, model):
    _require_cupy(master, "master")
    _require_cupy(grad, "grad")
    if master.dtype != np.float32:
        raise TypeError(f"master weights must be float32, got {master.dtype}")
    _dtypes.check_dtype(grad.dtype, GRAD_DTYPES, "grad")
    arrays = [("grad", grad)] + list(states) + ([("model", model)] if model is not None else [])
    for name, a in arrays:
        _require_cupy(a, name)
        if a.shape != master.shape:
            raise ValueError(f"{name} has shape {a.shape}, master has shape {master.shape}")
    for name, a in list(states):
        if a.dtype != np.float32:
            raise TypeError(f"{name} must be float32, got {a.dtype}")
    if model is not None:
        _dtypes.check_dtype(model.dtype, MODEL_DTYPES, "model")
    for name, a in [("master", master)] + arrays:
        if a.size and not a.flags.c_contiguous:
            raise ValueError(f"{name} (shape {a.shape}) must be C-contiguous")
    _no_overlap([("master", master)] + arrays)


def _model_arg(master, model):
    """``model`` as the kernels take it: None when it is the master array itself (a float32 model trained without a
    separate copy), which the kernels would otherwise write through two restrict pointers."""
    cupy = _cupy()
    if isinstance(model, cupy.ndarray) and isinstance(master, cupy.ndarray) and model.data.ptr == master.data.ptr \
            and model.dtype == master.dtype and model.shape == master.shape and model.strides == master.strides:
        return None
    return model


def _skip_arg(found_inf):
    if found_inf is None:
        return _NULL
    _require_cupy(found_inf, "found_inf")
    if found_inf.dtype != np.int32 or found_inf.size != 1:
        raise ValueError(f"found_inf must be a 1-element int32 CuPy array, got {found_inf.dtype} {found_inf.shape}")
    return found_inf


def _real(v, what: str) -> float:
    """A real number (bools and strings excluded) as a Python float; TypeError naming ``what`` otherwise."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a real number, got {type(v).__name__}")
    return float(v)


_F32_TINY = float(np.finfo(np.float32).tiny)  # 2^-126, float32's smallest normal


def _inv_scale(v) -> float:
    """``inv_scale`` as a float: finite in float32 (as_float), and 0 or at least float32's smallest normal: the
    kernels run with CuPy's -ftz=true, which would read a subnormal one as 0 and zero every gradient."""
    f = as_float(v, "inv_scale")
    if f != 0 and abs(f) < _F32_TINY:
        raise ValueError(f"inv_scale {f} is below float32's smallest normal number ({_F32_TINY:.3g}): the kernels "
                         "flush it to 0 (a loss scale above 2^126)")
    return f


def _hyper(v, what: str, lo: float | None = 0.0, below: float | None = None) -> float:
    """A hyper-parameter as a float finite in float32 (TypeError for a non-number), with torch.optim's range checks
    (ValueError): ``v >= lo`` and, when ``below`` is given, ``v < below``."""
    f = as_float(v, what)
    if (lo is not None and f < lo) or (below is not None and f >= below):
        rng = f"[{lo}, {below})" if below is not None else f">= {lo}"
        raise ValueError(f"{what} must be {rng}, got {f}")
    return f


def _betas(betas) -> tuple[float, float]:
    """Adam's (beta1, beta2), each in [0, 1) (torch.optim.AdamW's check)."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"betas must be a pair (beta1, beta2), got {type(betas).__name__}")
    return _hyper(betas[0], "betas[0]", 0.0, 1.0), _hyper(betas[1], "betas[1]", 0.0, 1.0)


def sgd_momentum_step(master, grad, momentum_buf, model=None, *, lr, momentum=0.9, dampening=0.0,
                      weight_decay=0.0, nesterov=False, first_step=False, inv_scale=1.0, found_inf=None):
    """One fused SGD-with-momentum step on float32 master weights (torch.optim.SGD semantics), in place.

    The float32 master copy of Micikevicius et al. 2018 (Sec. 3.1); momentum and Nesterov as
    ``torch.optim.SGD`` (after Sutskever et al. 2013).

    ``g = grad*inv_scale + weight_decay*master``; with ``momentum`` nonzero (as float32): ``buf = g`` on the first
    step, else ``buf = momentum*buf + (1-dampening)*g``, and ``g = g + momentum*buf`` (Nesterov) or ``buf``
    (momentum 0: plain SGD, ``momentum_buf`` neither read nor written); ``master -= lr*g``;
    ``model = round(master)`` (float16/bfloat16/float32 copy, same pass). ``first_step`` must stay True until a
    step has been applied: a step skipped on the device (``found_inf``) writes nothing, the buffer included.

    Shapes: all arrays the same shape, C-contiguous. Dtypes: master and momentum_buf float32; grad
    float32/float16/bfloat16; model (optional) float16/bfloat16/float32. ``found_inf`` (optional 1-element int32
    device flag): the step is skipped on the device when it is nonzero. Scalars (``lr`` per step, the others
    dimensionless) are passed as float32. Returns ``master`` (updated in place).

    Raises:
        TypeError: an array argument (or ``found_inf``) not a CuPy array; master or momentum_buf not float32;
            grad not float32/float16/bfloat16; model not float16/bfloat16/float32.
        ValueError: an array of another shape than master; a non-empty array that is not C-contiguous;
            ``nesterov`` with ``momentum <= 0`` or ``dampening != 0``; ``found_inf`` not int32 or not of one
            element; ``lr``, ``momentum`` or ``weight_decay`` negative (torch.optim.SGD's checks); a scalar NaN,
            infinite or beyond float32's range. All before any launch (a scalar that is not a real number, or
            ``nesterov`` / ``first_step`` not a bool: TypeError).
    """
    lr, momentum = _hyper(lr, "lr"), _hyper(momentum, "momentum")
    dampening, weight_decay = _hyper(dampening, "dampening", None), _hyper(weight_decay, "weight_decay")
    inv_scale = _inv_scale(inv_scale)
    nesterov, first_step = as_bool(nesterov, "nesterov"), as_bool(first_step, "first_step")
    if nesterov and (np.float32(momentum) <= 0 or dampening != 0):  # the kernel sees momentum as float32
        raise ValueError("Nesterov momentum requires momentum > 0 and dampening == 0")
    model = _model_arg(master, model)
    _check_param_set(master, grad, [("momentum_buf", momentum_buf)], model)
    skip = _skip_arg(found_inf)
    if master.size == 0:
        return master
    mdt = model.dtype if model is not None else _dtypes.float32
    k = _compile.get_kernel(SOURCE, _SGD[(grad.dtype, mdt)])
    n = master.size
    _compile.launch(k, (_grid(n),), (_BLOCK,),
                    (grad, master, momentum_buf, model if model is not None else _NULL, np.int64(n),
                     np.float32(lr), np.float32(momentum), np.float32(dampening), np.float32(weight_decay),
                     np.int32(bool(nesterov)), np.int32(bool(first_step)), np.float32(inv_scale), skip))
    return master


def adamw_bias_corrections(step: int, betas=(0.9, 0.999)) -> tuple[float, float]:
    """(1 - beta1^step, sqrt(1 - beta2^step)) computed in float64 on the host (step counts from 1).

    Adam's bias corrections (Kingma & Ba 2015, Algorithm 1), as :func:`adamw_step` uses them; ``betas`` = (beta1,
    beta2), each in [0, 1). Raises TypeError when ``step`` is not an integer or ``betas`` not a pair of real
    numbers, ValueError when ``step < 1`` or a beta is outside [0, 1).
    """
    step = as_int(step, "step")
    if step < 1:
        raise ValueError(f"AdamW step count starts at 1, got {step}")
    b1, b2 = _betas(betas)
    return 1.0 - b1 ** step, math.sqrt(1.0 - b2 ** step)


def adamw_step(master, grad, exp_avg, exp_avg_sq, model=None, *, lr, step, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=1e-2, inv_scale=1.0, found_inf=None):
    """One fused AdamW step on float32 master weights (torch.optim.AdamW semantics, amsgrad off), in place.

    ``master *= 1 - lr*wd``; ``m = b1*m + (1-b1)*g``; ``v = b2*v + (1-b2)*g^2`` with ``g = grad*inv_scale``;
    ``master -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)``; ``model = round(master)`` in the same pass.
    ``step`` is the 1-based step count; the bias corrections are computed on the host in float64 and passed as
    float32. Shapes/dtypes as :func:`sgd_momentum_step` (exp_avg, exp_avg_sq float32). Returns ``master``.
    Decoupled weight decay of Loshchilov & Hutter 2019 (AdamW, Algorithm 2), scaled by ``lr`` as in torch;
    float32 master weights as Micikevicius et al. 2018 (Sec. 3.1).

    Raises:
        TypeError: an array argument (or ``found_inf``) not a CuPy array; master, exp_avg or exp_avg_sq not
            float32; grad not float32/float16/bfloat16; model not float16/bfloat16/float32.
        ValueError: an array of another shape than master; a non-empty array that is not C-contiguous;
            ``step < 1``; ``found_inf`` not int32 or not of one element; ``lr``, ``eps`` or ``weight_decay``
            negative or a beta outside [0, 1) (torch.optim.AdamW's checks); a scalar NaN, infinite or beyond
            float32's range. All before any launch (``step`` not an integer, ``betas`` not a pair or a scalar not
            a real number: TypeError).
    """
    bc1, bc2s = adamw_bias_corrections(step, betas)  # (validates step and betas)
    b1, b2 = float(betas[0]), float(betas[1])
    lr, eps, weight_decay = _hyper(lr, "lr"), _hyper(eps, "eps"), _hyper(weight_decay, "weight_decay")
    inv_scale = _inv_scale(inv_scale)
    model = _model_arg(master, model)
    _check_param_set(master, grad, [("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)], model)
    skip = _skip_arg(found_inf)
    if master.size == 0:
        return master
    mdt = model.dtype if model is not None else _dtypes.float32
    k = _compile.get_kernel(SOURCE, _ADAMW[(grad.dtype, mdt)])
    n = master.size
    _compile.launch(k, (_grid(n),), (_BLOCK,),
                    (grad, master, exp_avg, exp_avg_sq, model if model is not None else _NULL, np.int64(n),
                     np.float32(lr), np.float32(b1), np.float32(b2), np.float32(1.0 - b1), np.float32(1.0 - b2),
                     np.float32(eps),
                     np.float32(weight_decay), np.float32(bc1), np.float32(bc2s), np.float32(inv_scale), skip))
    return master


# ----------------------------------------------------------------------------------------------------------
# Dynamic loss scaling (host policy)
class DynamicLossScaler:
    """Dynamic loss scaling (Micikevicius et al. 2018; the torch.amp.GradScaler policy).

    ``scale`` starts at ``init_scale`` (2^16). After a step whose gradients held an inf/NaN the step is skipped
    and ``scale *= backoff_factor`` (0.5); after ``growth_interval`` (2000) consecutive clean steps
    ``scale *= growth_factor`` (2), unless that would pass 2^126 (torch stops where float32 overflows, 2^128;
    here 1/scale must stay a normal float32, which the kernels, compiled with flush-to-zero, would read as 0).
    ``min_scale``/``max_scale`` clamp it, ``init_scale`` included (default: no clamp).

    Typical loop (read ``inv_scale`` for this step's gradients before :meth:`update`, which may change it)::

        loss = forward(...) * scaler.scale          # or scaler.scale_loss(loss)
        grads = backward(...)
        found = scaler.unscale_(grads)              # one launch, no sync
        if scaler.update(found):                    # update() syncs once and returns True if the step is clean
            optimizer_step(grads)

        # or, with a fused step that unscales in float32 (the form to use with float16 gradients: unscale_
        # writes the unscaled values back in the gradients' dtype, where float16 loses those below 6.1e-5
        # (below ~6e-8 they become 0), what the loss scale was for):
        inv = scaler.inv_scale                      # this step's
        found = scaler.check(grads)
        adamw_step(master, grads, m, v, model, lr=lr, step=t, inv_scale=inv, found_inf=found)  # skipped on device
        if scaler.update(found):                    # the flag is read here; count the step only when clean
            t += 1

    ``history`` holds one ``(scale_used, overflow)`` tuple per :meth:`update`.

    Raises TypeError (at construction) for an argument that is not a real number (``growth_interval``: an
    integer), ValueError when ``init_scale``, ``min_scale`` or ``max_scale`` is not positive and finite,
    ``min_scale > max_scale``, ``growth_factor`` is not finite and > 1, ``backoff_factor`` is outside (0, 1) or
    ``growth_interval < 1``.
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 min_scale=None, max_scale=None):
        def positive(v, what):
            f = _real(v, what)
            if not (f > 0 and math.isfinite(f)):
                raise ValueError(f"{what} must be a positive finite number, got {v}")
            return f

        init_scale = positive(init_scale, "init_scale")
        growth_factor, backoff_factor = _real(growth_factor, "growth_factor"), _real(backoff_factor, "backoff_factor")
        if not (growth_factor > 1.0 and math.isfinite(growth_factor)):
            raise ValueError(f"growth_factor must be finite and > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        growth_interval = as_int(growth_interval, "growth_interval")
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        self.min_scale = None if min_scale is None else positive(min_scale, "min_scale")
        self.max_scale = None if max_scale is None else positive(max_scale, "max_scale")
        if self.min_scale is not None and self.max_scale is not None and self.min_scale > self.max_scale:
            raise ValueError(f"min_scale ({self.min_scale}) must not exceed max_scale ({self.max_scale})")
        self.scale = self._clamp(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.growth_tracker = 0
        self.history: list[tuple[float, bool]] = []

    MAX_SCALE = 2.0 ** 126  # growth stops here: 1 / scale stays a normal float32 (flush-to-zero kernels)

    def _clamp(self, s: float) -> float:
        if self.min_scale is not None:
            s = max(s, self.min_scale)
        if self.max_scale is not None:
            s = min(s, self.max_scale)
        return s

    @property
    def inv_scale(self) -> float:
        return 1.0 / self.scale

    def scale_loss(self, loss):
        return loss * self.scale

    def unscale_(self, grads, found_inf=None):
        """Unscale ``grads`` in place with 1/scale and return the device overflow flag (no sync)."""
        return unscale_and_check(grads, self.inv_scale, found_inf)

    def check(self, grads, found_inf=None):
        """The device overflow flag of ``grads`` without unscaling (for fused steps that take inv_scale)."""
        return check_finite(grads, found_inf)

    def update(self, found_inf) -> bool:
        """Apply the policy for one step; returns True when the step is clean (apply it), False to skip.

        ``found_inf``: the device flag from :meth:`unscale_` (read here: the step's one host sync; any one-element
        shape; a torch tensor too), or a Python bool/int.
        """
        if hasattr(found_inf, "get"):  # CuPy
            flag = np.asarray(found_inf.get())
        elif hasattr(found_inf, "cpu"):  # a torch tensor (e.g. a GradScaler's found_inf)
            flag = np.asarray(found_inf.cpu())
        else:
            flag = np.asarray(found_inf)
        if flag.size != 1:
            raise ValueError(f"found_inf must hold one element, got shape {flag.shape}")
        overflow = bool(int(flag.reshape(-1)[0]))
        self.history.append((self.scale, overflow))
        if overflow:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker >= self.growth_interval:
                grown = self.scale * self.growth_factor
                if grown <= self.MAX_SCALE:  # torch: only while the float32 scale stays finite
                    self.scale = grown
                self.growth_tracker = 0
        self.scale = self._clamp(self.scale)
        return not overflow

    def state_dict(self) -> dict:
        """The policy's state and settings (as torch.amp.GradScaler's: scale, factors, interval, tracker)."""
        return {"scale": self.scale, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, d: dict) -> None:
        """Restore :meth:`state_dict` (an older dict with only ``scale`` and ``growth_tracker`` keeps the rest)."""
        self.scale = float(d["scale"])
        self.growth_tracker = int(d["growth_tracker"])
        self.growth_factor = float(d.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(d.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(d.get("growth_interval", self.growth_interval))
