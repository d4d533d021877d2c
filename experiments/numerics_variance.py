"""Experiment 4 — variance for LayerNorm: sum/sum-of-squares vs two-pass vs Welford as the mean grows.

Rows x = mu + z (z standard normal, so the spread sigma = 1) with mu/sigma from 1 to 1e7. Three ways to get
the statistics LayerNorm needs (Chan, Golub & LeVeque, *Algorithms for computing the sample variance*, 1983):

* ``sumsq``: one pass, var = E[x^2] - E[x]^2 — the two terms are ~mu^2 and their difference sigma^2, so the
  relative error grows like u (mu/sigma)^2 (catastrophic cancellation; variance may even come out negative);
* ``two_pass``: mean first, then the mean of squared deviations — error ~ n u (plus (n u kappa)^2);
* ``welford``: one pass with a running mean and M2 (Welford 1962) — error ~ n u kappa, no cancellation blow-up.

Inputs float32 and float16 (the values are rounded to the input format; the float64 reference is the variance of
the rounded values), arithmetic float32 as the kernels do (NumPy emulation, every operation rounded), plus
float16 arithmetic on float16 input to show what storage-precision statistics do (x^2 overflows above 256).
With a GPU, ``cuflash.layer_norm(..., eps=0, return_stats=True)`` (float32 Welford) is measured on the same rows
(var = 1/rstd^2). The model part runs on the CPU.

Writes experiments/results/numerics_variance.json|csv and plots/numerics_variance.png for the full run; a partial
run gets its own name, never over the committed files: numerics_variance_quick (--quick), numerics_variance_model_only
(--model-only, or no GPU), numerics_variance_quick_model_only, or --name.

    python experiments/numerics_variance.py [--quick] [--model-only] [--name NAME]
    python experiments/numerics_variance.py --replot   # redraw plots/numerics_variance.png from the results JSON
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/_common.py

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from _common import add_replot_arg, load_results, positive_int, run_names  # noqa: E402
from cuflash import bench, numerics  # noqa: E402

METHODS = ("sumsq", "two_pass", "welford")
# (input dtype, arithmetic dtype)
CASES = (("float32", "float32"), ("float16", "float32"), ("float16", "float16"))


def rel_err(v, ref):
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.abs(v - ref) / np.abs(ref)
    e = np.where(np.isfinite(v), e, np.inf)
    return np.where(ref > 0, e, np.nan)  # a row rounded to one value (fp16, mu >> ulp) has no spread left


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke size: rows of 256, 15 ratios, 2 repeats")
    ap.add_argument("--model-only", action="store_true", help="NumPy emulation only (no GPU needed)")
    ap.add_argument("--n", type=positive_int, default=None, help="row length (default 1024; 256 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="results and plot file stem (default: see above)")
    add_replot_arg(ap, "numerics_variance (--quick, --model-only, --name: that run's file)")
    args = ap.parse_args(argv)
    if args.replot:
        stem = run_names(args, "numerics_variance", "numerics_variance", "model_only" if args.model_only else "")
        return replot(args.name, stem)
    n = args.n or (256 if args.quick else 1024)
    reps = 2 if args.quick else 8
    ratios = np.logspace(0, 7, 15 if args.quick else 29)
    rng = np.random.default_rng(args.seed)
    z = rng.standard_normal((len(ratios) * reps, n))
    z = (z - z.mean(axis=1, keepdims=True)) / z.std(axis=1, keepdims=True)
    mu = np.repeat(ratios, reps)
    x = z + mu[:, None]

    gpu = not args.model_only and bench.has_gpu()
    if not args.model_only and not gpu:
        print("numerics_variance: no CUDA device visible to CuPy; running the NumPy model only "
              "(the cuflash.layer_norm curve needs a GPU)")
    stem = run_names(args, "numerics_variance", "numerics_variance", "" if gpu else "model_only")
    jobs = [("model", i, a, m) for i, a in CASES for m in METHODS]
    if gpu:
        jobs += [("gpu", i, "float32", "layer_norm") for i in ("float32", "float16")]
    rows, curves = [], {}
    for backend, idt, adt, method in tqdm(jobs, desc="variance"):
        xin = numerics.round_to(x, numerics.FORMATS[idt])
        ok = np.isfinite(xin).all(axis=1)
        with np.errstate(invalid="ignore"):
            ref = xin.var(axis=1)
        if backend == "model":
            v = numerics.variance(xin, method, numerics.FORMATS[adt])
        else:
            import cupy as cp

            import cuflash

            xd = cp.asarray(x.astype(np.float32).astype(numerics.FORMATS[idt]))
            _, mean, rstd = cuflash.layer_norm(xd, (n,), eps=0.0, return_stats=True)
            with np.errstate(divide="ignore"):
                v = 1.0 / rstd.get().astype(np.float64) ** 2
        e = np.where(ok, rel_err(v, ref), np.nan)
        per_ratio = e.reshape(len(ratios), reps)
        with np.errstate(invalid="ignore"):
            worst = np.where(np.isnan(per_ratio).all(axis=1), np.nan, np.nanmax(np.where(np.isnan(per_ratio), -1,
                                                                                          per_ratio), axis=1))
        worst = np.where(worst < 0, np.nan, worst)
        label = f"{backend} {method} in={idt} arith={adt}"
        curves[label] = (backend, method, idt, adt, worst)
        for r, w in zip(ratios, worst):
            rows.append({"backend": backend, "method": method, "input_dtype": idt, "arith_dtype": adt,
                         "mean_over_std": float(r), "n": n, "max_rel_err_var": None if np.isnan(w) else float(w)})
    # summary: the ratio where each curve first exceeds 1% relative error
    summary = []
    for label, (be, m, idt, adt, w) in curves.items():
        over = np.nonzero(np.nan_to_num(w, nan=0.0) > 1e-2)[0]
        summary.append({"curve": label, "first_ratio_err_over_1pct": float(ratios[over[0]]) if len(over) else None,
                        "err_at_ratio_1": float(w[0]), "err_at_ratio_1e4": float(w[np.argmin(np.abs(ratios - 1e4))])})
    print(bench.table(summary, ["curve", "first_ratio_err_over_1pct", "err_at_ratio_1", "err_at_ratio_1e4"]))
    path = bench.write_results(args.name, rows, {"n": n, "repeats": reps, "summary": summary,
                                                 "input": "x = mu + z, z standardised (sigma = 1)"})
    print("wrote", path)
    plot(ratios, curves, n, stem)
    return 0


def replot(name, stem):
    """Redraw the figure from experiments/results/<name>.json (curves rebuilt from its rows) into plots/<stem>.png."""
    doc = load_results(name)
    rows = doc["rows"]
    ratios = np.array(sorted({r["mean_over_std"] for r in rows}))
    curves = {}
    for r in rows:
        key = (r["backend"], r["method"], r["input_dtype"], r["arith_dtype"])
        curves.setdefault(key, {})[r["mean_over_std"]] = r["max_rel_err_var"]
    out = {}
    for (be, m, idt, adt), pts in curves.items():
        w = np.array([np.nan if pts.get(x) is None else pts[x] for x in ratios], dtype=np.float64)
        out[f"{be} {m} in={idt} arith={adt}"] = (be, m, idt, adt, w)
    plot(ratios, out, doc["meta"].get("n") or rows[0]["n"], stem)
    return 0


def plot(ratios, curves, n, stem="numerics_variance"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11.5, 5.2))
    color = {"sumsq": "C3", "two_pass": "C0", "welford": "C2", "layer_norm": "k"}
    style = {("float32", "float32"): "-", ("float16", "float32"): "--", ("float16", "float16"): ":"}
    gpu_marker = {"float32": dict(marker="o", mfc="k"), "float16": dict(marker="s", mfc="none")}
    labels = set()
    for label, (be, m, idt, adt, w) in curves.items():
        y = np.where(np.isinf(w), 1e3, np.maximum(w, 1e-10))
        if be == "gpu":
            kw = dict(ms=5, lw=0, mec="k", **gpu_marker.get(idt, dict(marker="D", mfc="none")))
            lab = f"GPU layer_norm (fp32 Welford) in={idt}"
        else:
            kw = dict(ls=style[(idt, adt)])
            lab = f"{m} in={idt} arith={adt}"
        if lab in labels or np.isnan(w).all():  # one legend entry per curve; empty curves not listed
            lab = "_nolegend_" if lab in labels else f"{lab} (no finite points)"
        labels.add(lab)
        ax.plot(ratios, y, color=color[m], label=lab, **kw)
    u = 2.0 ** -24
    ax.plot(ratios, u * ratios ** 2, color="0.5", lw=0.8, label=r"$u\,(\mu/\sigma)^2$ (sumsq theory, fp32)")
    ax.axhline(1.0, color="0.3", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-10, 2e3)
    ax.set_xlabel(r"row mean / row std  ($\mu/\sigma$)")
    ax.set_ylabel("max relative error of the variance (1e3: inf/NaN)")
    ax.set_title(f"LayerNorm statistics, rows of n={n}")
    ax.grid(alpha=0.3)
    h, lab = ax.get_legend_handles_labels()
    seen = {}
    for hh, ll in zip(h, lab):  # dedupe by label, keep the first handle
        seen.setdefault(ll, hh)
    ax.legend(list(seen.values()), list(seen.keys()), fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0)
    fig.tight_layout()
    bench.PLOTS.mkdir(parents=True, exist_ok=True)
    out = bench.PLOTS / f"{stem}.png"
    fig.savefig(out, dpi=120, bbox_inches="tight")  # keeps the legend outside the axes in the image
    plt.close(fig)
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
