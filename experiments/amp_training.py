"""Experiment 5 — mixed-precision training: master weights, gradient underflow, dynamic loss scaling.

After Micikevicius et al., *Mixed Precision Training* (ICLR 2018):
 (a) an update smaller than half an ulp of a float16 weight vanishes (w - lr*g rounds back to w), but survives in
     a float32 master copy — shown for 1000 steps of lr*g = 1e-4 on w = 1 (half ulp of float16 at 1 is 4.9e-4),
     with the fused ``cuflash.amp.sgd_momentum_step`` (float32 master, float16 model copy) on the GPU and a NumPy
     model of it everywhere;
 (b) small gradients underflow to zero (or to imprecise subnormals) when cast to float16; multiplying by a loss
     scale S first moves them into range, until the largest ones overflow — fractions against log2 S for a
     log-uniform gradient population (CPU);
 (c) a two-layer MLP classifier trained with CuPy on synthetic teacher-labelled data in float32, float16 without
     scaling, float16 with ``cuflash.amp.DynamicLossScaler`` and bfloat16 (GPU). Matmuls accumulate in float32 and
     round their outputs to the compute dtype (tensor-core semantics), every activation and gradient is rounded
     to it; the softmax cross-entropy runs in float32 as under autocast. Gradients go through one multi-tensor
     ``check_finite`` launch, the scaler syncs once per step, and one fused SGD-momentum launch over a flat
     parameter buffer unscales, updates the float32 master weights and writes the low-precision model copy.
     Recorded per step: loss, loss scale, overflow, and the fraction of hidden-layer gradient entries that
     underflowed to exactly zero.

    python experiments/amp_training.py [--quick] [--model-only]
    python experiments/amp_training.py --replot    # redraw plots/amp_training.png from the results JSON

Writes experiments/results/amp_training.json|csv and plots/amp_training.png for the full run; a partial run gets
its own name so that it never replaces the committed full run: amp_training_quick (--quick),
amp_training_model_only (--model-only, or no GPU: parts (a) and (b) only), amp_training_quick_model_only, or
--name's (the plot then plots/<name>.png).

Figure panels: (a), (b), (c) as above and (d) the loss-scale trajectory of the (c) run with dynamic loss scaling.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/_common.py

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from _common import (  # noqa: E402
    add_replot_arg, default_help, fill_defaults, load_results, positive_float, positive_int, run_names)
from cuflash import bench  # noqa: E402

F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)


# ----------------------------------------------------------------------------------------------------------
# (a) updates below half an ulp
def part_a(steps, gpu):
    lr, g, w0 = 1e-4, 1.0, 1.0
    traj = {"float16 weights": [], "bfloat16 weights": [], "float32 master": [], "float16 copy of master": []}
    w16, wb, m = np.float16(w0), BF16.type(w0), np.float32(w0)
    for _ in range(steps):
        w16 = np.float16(np.float32(w16) - np.float32(lr * g))
        wb = BF16.type(np.float32(wb) - np.float32(lr * g))
        m = np.float32(m - np.float32(lr) * np.float32(g))
        traj["float16 weights"].append(float(w16))
        traj["bfloat16 weights"].append(float(wb))
        traj["float32 master"].append(float(m))
        traj["float16 copy of master"].append(float(np.float16(m)))
    out = {"lr_times_grad": lr * g, "half_ulp_fp16_at_1": 2.0 ** -11, "steps": steps,
           "final": {k: v[-1] for k, v in traj.items()}, "expected_master": w0 - steps * lr * g}
    if gpu:
        import cupy as cp

        from cuflash import amp

        n = 4097
        master = cp.full(n, w0, dtype=np.float32)
        buf = cp.zeros(n, np.float32)
        model = cp.full(n, w0, dtype=np.float16)
        w_lp = cp.full(n, w0, dtype=np.float16)
        grad = cp.full(n, g, dtype=np.float16)
        for _ in range(steps):
            amp.sgd_momentum_step(master, grad, buf, model, lr=lr, momentum=0.0)
            w_lp = (w_lp.astype(np.float32) - np.float32(lr) * grad.astype(np.float32)).astype(np.float16)
        out["gpu"] = {"fused_master": float(master[0]), "fused_model_copy": float(model[0]),
                      "fp16_weights": float(w_lp[0]),
                      "master_matches_model": bool(abs(float(master[0]) - traj["float32 master"][-1]) < 1e-6),
                      "copy_is_rounded_master": bool((model.get() == master.get().astype(np.float16)).all())}
    return traj, out


# ----------------------------------------------------------------------------------------------------------
# (b) gradient underflow against the loss scale
def part_b(n, rng):
    g = 10.0 ** rng.uniform(-12, -1, n) * rng.choice([-1.0, 1.0], n)
    log2s = np.arange(0, 33)
    rows = []
    for k in log2s:
        s = 2.0 ** k
        with np.errstate(over="ignore"):
            h = (g * s).astype(np.float16)
            b = (g * s).astype(np.float32).astype(BF16)
        a = np.abs(h.astype(np.float64))
        rel = np.abs(h.astype(np.float64) / s - g) / np.abs(g)
        rows.append({"log2_scale": int(k), "fp16_zero": float((a == 0).mean()),
                     "fp16_subnormal": float(((a > 0) & (a < 2.0 ** -14)).mean()),
                     "fp16_overflow": float(np.isinf(a).mean()),
                     "fp16_rel_err_gt_1pct": float((np.nan_to_num(rel, nan=1.0, posinf=1.0) > 1e-2).mean()),
                     "bf16_zero": float((b.astype(np.float64) == 0).mean())})
    return rows


# ----------------------------------------------------------------------------------------------------------
# (c) MLP training
def bf16_round(cp, x):
    """Round float32 values to bfloat16 (nearest even) and return them as float32 (pure integer ops)."""
    u = x.view(cp.uint32)
    r = (u >> cp.uint32(16)) & cp.uint32(1)
    return ((u + cp.uint32(0x7FFF) + r) & cp.uint32(0xFFFF0000)).view(cp.float32)


class Net:
    """Two-layer MLP x -> relu(x W1 + b1) W2 + b2, parameters in one flat float32 master buffer."""

    def __init__(self, cp, d_in, hidden, classes, rng, dtype, scaled):
        self.cp, self.dtype, self.scaled = cp, dtype, scaled
        shapes = [(d_in, hidden), (hidden,), (hidden, classes), (classes,)]
        init = [rng.standard_normal(shapes[0]) * np.sqrt(2.0 / d_in), np.zeros(hidden),
                rng.standard_normal(shapes[2]) * np.sqrt(1.0 / hidden), np.zeros(classes)]
        self.shapes = shapes
        self.sizes = [int(np.prod(s)) for s in shapes]
        self.offs = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        self.master = cp.asarray(np.concatenate([a.ravel() for a in init]).astype(np.float32))
        self.buf = cp.zeros_like(self.master)
        lp = dtype != np.float32
        # gradients: float16 arrays for float16; float32 arrays holding bfloat16 values for bfloat16
        self.gdt = F16 if dtype == F16 else np.dtype(np.float32)
        self.grads = cp.zeros(self.master.size, dtype=self.gdt)
        self.model = None
        if lp:
            try:
                self.model = cp.asarray(self.master.get().astype(dtype))
                self._weights_from_model()  # probe: bfloat16 views must work
            except Exception as e:  # pragma: no cover - depends on CuPy's bfloat16 support
                print(f"  (no {dtype} model-copy array on this CuPy: {e!r}; rounding the master instead)")
                self.model = None
        self.step_count = 0

    def q(self, x):
        cp = self.cp
        if self.dtype == np.float32:
            return x
        if self.dtype == F16:
            return x.astype(np.float16).astype(np.float32)
        return bf16_round(cp, x)

    def _weights_from_model(self):
        cp = self.cp
        if self.model is None:
            flat = self.q(self.master)
        elif self.model.dtype == F16:
            flat = self.model.astype(np.float32)
        else:
            flat = (self.model.view(cp.uint16).astype(cp.uint32) << cp.uint32(16)).view(cp.float32)
        return [flat[o:o + n].reshape(s) for o, n, s in zip(self.offs, self.sizes, self.shapes)]

    def loss_and_grads(self, X, Y, scale):
        cp, q = self.cp, self.q
        W1, b1, W2, b2 = self._weights_from_model()
        B = X.shape[0]
        z1 = q(X @ W1 + b1)
        h = cp.maximum(z1, 0)
        logits = q(h @ W2 + b2)
        # softmax cross-entropy in float32 (autocast keeps it there)
        m = logits.max(axis=1, keepdims=True)
        e = cp.exp(logits - m)
        ssum = e.sum(axis=1, keepdims=True)
        p = e / ssum
        loss = float((cp.log(ssum[:, 0]) + m[:, 0] - logits[cp.arange(B), Y]).mean())
        p[cp.arange(B), Y] -= 1.0
        dlogits = q(p * np.float32(scale / B))
        dW2 = q(h.T @ dlogits)
        db2 = q(dlogits.sum(axis=0))
        dh_full = (dlogits @ W2.T) * (z1 > 0)
        dh = q(dh_full)
        under = float(((dh == 0) & (dh_full != 0)).sum() / max(int((dh_full != 0).sum()), 1))
        dW1 = q(X.T @ dh)
        db1 = q(dh.sum(axis=0))
        views = []
        for g, o, n in zip((dW1, db1, dW2, db2), self.offs, self.sizes):
            self.grads[o:o + n] = g.ravel().astype(self.gdt)
            views.append(self.grads[o:o + n])
        return loss, views, under

    def step(self, lr, momentum, inv_scale):
        from cuflash import amp

        amp.sgd_momentum_step(self.master, self.grads, self.buf, self.model, lr=lr, momentum=momentum,
                              first_step=self.step_count == 0, inv_scale=inv_scale)
        self.step_count += 1

    def accuracy(self, X, Y):
        cp = self.cp
        W1, b1, W2, b2 = [w for w in self._weights_from_model()]
        logits = self.q(cp.maximum(self.q(X @ W1 + b1), 0) @ W2 + b2)
        return float((logits.argmax(axis=1) == Y).mean())


def part_c(args):
    import cupy as cp

    from cuflash import amp

    rng = np.random.default_rng(args.seed)
    d_in, hidden, classes = 64, 256, 10
    n_train, n_test = 32768, 8192
    Xall = rng.standard_normal((n_train + n_test, d_in)).astype(np.float32)
    T1 = rng.standard_normal((d_in, 64)) / np.sqrt(d_in)
    T2 = rng.standard_normal((64, classes))
    Yall = np.argmax(np.tanh(Xall @ T1) @ T2, axis=1)
    X, Y = cp.asarray(Xall[:n_train]), cp.asarray(Yall[:n_train])
    Xt, Yt = cp.asarray(Xall[n_train:]), cp.asarray(Yall[n_train:])
    variants = [("float32", np.dtype(np.float32), False), ("float16, no loss scaling", F16, False),
                ("float16, dynamic loss scaling", F16, True), ("bfloat16", BF16, False)]
    curves, finals = {}, []
    for name, dt, scaled in variants:
        net = Net(cp, d_in, hidden, classes, np.random.default_rng(args.seed + 1), dt, scaled)
        scaler = amp.DynamicLossScaler(init_scale=args.init_scale, growth_interval=args.growth_interval) \
            if scaled else None
        order = np.random.default_rng(args.seed + 2)
        rec = {"loss": [], "scale": [], "overflow": [], "underflow_frac": []}
        for step in tqdm(range(args.steps), desc=name, leave=False):
            idx = cp.asarray(order.integers(0, n_train, args.batch))
            S = scaler.scale if scaler else 1.0
            loss, views, under = net.loss_and_grads(X[idx], Y[idx], S)
            found = amp.check_finite(views)  # one launch over the four gradient tensors
            clean = scaler.update(found) if scaler else int(found) == 0
            if clean:
                net.step(args.lr, 0.9, 1.0 / S)
            rec["loss"].append(loss)
            rec["scale"].append(S)
            rec["overflow"].append(not clean)
            rec["underflow_frac"].append(under)
        acc = net.accuracy(Xt, Yt)
        curves[name] = rec
        tail = max(1, args.steps // 10)
        finals.append({"variant": name, "final_loss": float(np.mean(rec["loss"][-tail:])), "test_accuracy": acc,
                       "skipped_steps": int(np.sum(rec["overflow"])), "final_scale": rec["scale"][-1],
                       "mean_underflow_frac": float(np.mean(rec["underflow_frac"]))})
    return curves, finals


# ----------------------------------------------------------------------------------------------------------
FULL = {"steps": 2000, "growth_interval": 200}
QUICK = {"steps": 300, "growth_interval": 50}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --steps and --growth-interval (not what is given) "
                         "and part (b)'s sample; writes amp_training_quick unless --name")
    ap.add_argument("--model-only", action="store_true",
                    help="parts (a) and (b) in NumPy only (no GPU); writes amp_training_model_only unless --name")
    ap.add_argument("--steps", type=positive_int, help=default_help("training steps", "steps", FULL, QUICK))
    ap.add_argument("--batch", type=positive_int, default=4096)
    ap.add_argument("--lr", type=positive_float, default=0.2)
    ap.add_argument("--init-scale", type=positive_float, default=2.0 ** 16)
    ap.add_argument("--growth-interval", type=positive_int,
                    help=default_help("clean steps before the scale doubles (torch uses 2000)", "growth_interval",
                                      FULL, QUICK))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None,
                    help="results file stem (default amp_training for the full run, see above); the plot is "
                         "plots/amp_training.png for amp_training, else plots/<name>.png")
    add_replot_arg(ap, "amp_training")
    return fill_defaults(ap.parse_args(argv), FULL, QUICK)


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        return replot(args)
    gpu = not args.model_only and bench.has_gpu()
    if not args.model_only and not gpu:
        print("amp_training: no CUDA device visible to CuPy; running parts (a) and (b) in NumPy, "
              "skipping (c) the GPU training run")
    plot_stem = run_names(args, "amp_training", "amp_training", "" if gpu else "model_only")
    traj, a = part_a(1000, gpu)
    print("(a)", a)
    b = part_b(200_000 if args.quick else 2_000_000, np.random.default_rng(args.seed))
    print(bench.table(b[::4], list(b[0])))
    curves, finals = (part_c(args) if gpu else ({}, []))
    if finals:
        print(bench.table(finals, list(finals[0])))
    rows = [{"part": "b", **r} for r in b] + [{"part": "c", **r} for r in finals]
    for name, rec in curves.items():
        rows += [{"part": "c_curve", "variant": name, "step": i, "loss": rec["loss"][i], "scale": rec["scale"][i],
                  "overflow": rec["overflow"][i], "underflow_frac": rec["underflow_frac"][i]}
                 for i in range(len(rec["loss"]))]
    meta = {"a": a, "c_finals": finals, "args": vars(args), "c_skipped": not gpu}
    path = bench.write_results(args.name, rows, meta)
    print("wrote", path)
    plot(traj, a, b, curves, args, bench.PLOTS / f"{plot_stem}.png")
    ok = a["final"]["float16 weights"] == 1.0 and abs(a["final"]["float32 master"] - a["expected_master"]) < 1e-4
    if gpu:
        ok = ok and a["gpu"]["copy_is_rounded_master"] and a["gpu"]["fp16_weights"] == 1.0
    return 0 if ok else 1


def replot(args):
    """Redraw the figure from experiments/results/amp_training.json (the --name / --quick run's file): (a)'s
    trajectories are the NumPy model (deterministic, CPU) with the recorded GPU point from ``meta``, (b) and (c)
    the recorded rows."""
    import argparse as _ap

    plot_stem = run_names(args, "amp_training", "amp_training", "model_only" if args.model_only else "")
    doc = load_results(args.name)
    meta, rows = doc["meta"], doc["rows"]
    traj, _ = part_a(int(meta.get("a", {}).get("steps", 1000)), False)
    a = meta.get("a") or _
    b = [{k: v for k, v in r.items() if k != "part"} for r in rows if r.get("part") == "b"]
    curves = {}
    for r in sorted((r for r in rows if r.get("part") == "c_curve"), key=lambda r: r["step"]):
        rec = curves.setdefault(r["variant"], {"loss": [], "scale": [], "overflow": [], "underflow_frac": []})
        for k in rec:
            rec[k].append(r[k])
    args = _ap.Namespace(**{"batch": 4096, "lr": 0.2, "growth_interval": 200, **meta.get("args", {})})
    plot(traj, a, b, curves, args, bench.PLOTS / f"{plot_stem}.png")
    return 0


def plot(traj, a, b, curves, args, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0, 0]
    style = {"float16 weights": ("-", 4), "bfloat16 weights": ("--", 1.5), "float32 master": ("-", 4),
             "float16 copy of master": ("--", 1.5)}
    for k, v in traj.items():
        ls, lw = style.get(k, ("-", 1.2))
        ax.plot(np.arange(1, len(v) + 1), v, ls, label=k, lw=lw)
    if "gpu" in a:
        ax.scatter([len(next(iter(traj.values())))], [a["gpu"]["fused_master"]], color="k", zorder=5,
                   label="GPU fused step: master after 1000 steps")
    ax.set_title(f"(a) w=1, 1000 updates of lr*g={a['lr_times_grad']:g} (half ulp fp16 = {2**-11:.2g})", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("weight")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[0, 1]
    x = [r["log2_scale"] for r in b]
    for key, lab in (("fp16_zero", "float16: flushed to 0"), ("fp16_subnormal", "float16: subnormal"),
                     ("fp16_rel_err_gt_1pct", "float16: rel. error > 1%"), ("fp16_overflow", "float16: inf"),
                     ("bf16_zero", "bfloat16: flushed to 0")):
        ax.plot(x, [r[key] for r in b], marker=".", label=lab)
    ax.axvline(16, color="0.5", ls=":", lw=1)
    ax.set_title("(b) gradients 10^U(-12,-1) cast after multiplying by S", fontsize=10)
    ax.set_xlabel("log2 loss scale S")
    ax.set_ylabel("fraction of gradient entries")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1, 0]
    if curves:
        for name, rec in curves.items():
            L = np.asarray(rec["loss"])
            k = max(1, len(L) // 100)
            sm = np.convolve(L, np.ones(k) / k, mode="valid")
            ax.plot(np.arange(len(sm)) + k - 1, sm, label=name)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "(c) needs a GPU", ha="center", transform=ax.transAxes)
    ax.set_title(f"(c) MLP training loss (batch {args.batch}, SGD-momentum lr {args.lr})", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (running mean)")
    ax.grid(alpha=0.3)
    ax = axes[1, 1]
    if curves:
        name = "float16, dynamic loss scaling"
        rec = curves[name]
        s = np.log2(rec["scale"])
        ax.plot(s, color="C2", label="log2 loss scale")
        ov = np.nonzero(rec["overflow"])[0]
        ax.scatter(ov, s[ov], color="C3", marker="v", zorder=4, label=f"overflow: step skipped ({len(ov)})")
        ax2 = ax.twinx()
        for nm, r in curves.items():
            if nm.startswith("float16"):
                ax2.plot(r["underflow_frac"], lw=0.8, alpha=0.6, label=f"underflow frac, {nm}")
        ax2.set_ylabel("fraction of hidden-gradient entries flushed to 0")
        ax2.legend(fontsize=7, loc="center right")
        ax.legend(fontsize=8, loc="upper left")
    else:
        ax.text(0.5, 0.5, "(d) needs the (c) GPU run", ha="center", transform=ax.transAxes)
    ax.set_title(f"(d) loss-scale trajectory of (c) float16 + dynamic scaling\n(x2 after {args.growth_interval} "
                 f"clean steps, x0.5 on overflow)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("log2 scale")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
