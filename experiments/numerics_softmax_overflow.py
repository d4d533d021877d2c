"""Experiment 3 — softmax overflow: naive vs safe vs online softmax as the inputs grow, for each dtype.

Rows x = s·u, u ~ U(-1, 1) with one entry set to 1 (so max x = s), for s from 0.1 to 1e5. The naive softmax
exp(x)/sum(exp(x)) overflows once exp(s) (or the sum) exceeds the format's largest finite value; the safe
softmax (subtract the row max: three passes) and the online softmax (one pass with a running max and a rescaled
sum; Milakov & Gimelshein, *Online normalizer calculation for softmax*, 2018) never do.

Two backends:
* ``model`` (CPU, always): NumPy emulation with every operation rounded to the format (float32, float16,
  bfloat16 and the two float8 formats) — where overflow happens when the arithmetic itself is low precision
  (float16: exp(x) > 65504 at x > 11.09; float8 e4m3fn has no infinity, so overflow is NaN).
* ``gpu``: ``cuflash.softmax(x, method=...)`` on float32/float16/bfloat16 inputs; the kernels compute in float32,
  so the naive method fails at x ~ 88.7 for every input dtype (after the input itself still fits).
Reported: the first s where each (backend, dtype, method) gives inf/NaN, and max abs error against float64
SciPy of the rounded input elsewhere.

Writes experiments/results/numerics_softmax_overflow.json|csv and plots/numerics_softmax_overflow.png for the full
run; a partial run gets its own name, never over the committed files: numerics_softmax_overflow_quick (--quick),
numerics_softmax_overflow_model_only (--model-only, or no GPU), numerics_softmax_overflow_quick_model_only, or --name.

    python experiments/numerics_softmax_overflow.py [--quick] [--model-only] [--name NAME]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/_common.py

import numpy as np  # noqa: E402
import scipy.special  # noqa: E402
from tqdm import tqdm  # noqa: E402

from _common import positive_int, run_names  # noqa: E402
from cuflash import bench, numerics  # noqa: E402

METHODS = ("naive", "safe", "online")
GPU_DTYPES = ("float32", "float16", "bfloat16")


def make_input(scales, n, rng):
    u = rng.uniform(-1, 1, (len(scales), n))
    u[:, n // 3] = 1.0
    return u * np.asarray(scales)[:, None]


def evaluate(y, ref):
    """Per row: finite?, max abs error (NaN where the output is not finite)."""
    y = np.asarray(y, dtype=np.float64)
    fin = np.isfinite(y).all(axis=1)
    with np.errstate(invalid="ignore"):
        err = np.where(fin, np.abs(y - ref).max(axis=1), np.nan)
    return fin, err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke size: rows of 256, 30 magnitudes")
    ap.add_argument("--model-only", action="store_true", help="NumPy emulation only (no GPU needed)")
    ap.add_argument("--n", type=positive_int, default=None, help="row length (default 1024; 256 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="results and plot file stem (default: see above)")
    args = ap.parse_args(argv)
    n = args.n or (256 if args.quick else 1024)
    scales = np.logspace(-1, 5, 30 if args.quick else 97)
    rng = np.random.default_rng(args.seed)
    x = make_input(scales, n, rng)
    rows, curves = [], {}

    jobs = [("model", d, m) for d in numerics.FORMATS for m in METHODS]
    gpu = not args.model_only and bench.has_gpu()
    if not args.model_only and not gpu:
        print("numerics_softmax_overflow: no CUDA device visible to CuPy; running the NumPy model only")
    stem = run_names(args, "numerics_softmax_overflow", "numerics_softmax_overflow", "" if gpu else "model_only")
    if gpu:
        import cupy as cp

        import cuflash

        jobs += [("gpu", d, m) for d in GPU_DTYPES for m in METHODS]
    for backend, dname, method in tqdm(jobs, desc="softmax overflow"):
        dt = numerics.FORMATS[dname]
        xr = numerics.round_to(x, dt)  # the input as stored in this format
        with np.errstate(invalid="ignore", over="ignore"):
            ref = scipy.special.softmax(xr, axis=1)
        input_ok = np.isfinite(xr).all(axis=1)
        if backend == "model":
            y = numerics.softmax_emulated(xr, method, dt)
        else:
            xd = cp.asarray(x.astype(np.float32).astype(dt))
            y = cuflash.softmax(xd, axis=-1, method=method).get().astype(np.float64)
        fin, err = evaluate(y, ref)
        bad = np.nonzero(~fin & input_ok)[0]
        first_bad = float(scales[bad[0]]) if len(bad) else None
        curves[(backend, dname, method)] = (fin, err, input_ok)
        for i, s in enumerate(scales):
            rows.append({"backend": backend, "dtype": dname, "method": method, "scale": float(s),
                         "input_finite": bool(input_ok[i]), "output_finite": bool(fin[i]),
                         "max_abs_err": float(err[i]) if fin[i] else None})
        ok_err = err[fin & input_ok]
        rows_summary = {"backend": backend, "dtype": dname, "method": method, "first_nonfinite_scale": first_bad,
                        "largest_input_scale": float(scales[input_ok].max()) if input_ok.any() else None,
                        "max_err_where_finite": float(ok_err.max()) if ok_err.size else None,
                        "eps": numerics.format_info(dt)["eps"]}
        curves.setdefault("summary", []).append(rows_summary)
    summary = curves.pop("summary")
    print(bench.table(summary, ["backend", "dtype", "method", "first_nonfinite_scale", "largest_input_scale",
                                "max_err_where_finite", "eps"]))
    path = bench.write_results(args.name, rows, {"n": n, "summary": summary,
                                                 "input": "x = s*U(-1,1), max x = s"})
    print("wrote", path)
    plot(scales, curves, n, stem)
    safe_ok = all(s["first_nonfinite_scale"] is None for s in summary
                  if s["method"] != "naive" and not s["dtype"].startswith("float8"))
    print("safe and online never overflow where the input is finite:", safe_ok)
    return 0 if safe_ok else 1


def plot(scales, curves, n, stem="numerics_softmax_overflow"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = sorted({k[0] for k in curves}, key=["model", "gpu"].index)
    fig, axes = plt.subplots(1, len(backends), figsize=(7.5 * len(backends), 4.6), squeeze=False)
    styles = {"naive": "-", "safe": "--", "online": ":"}
    dnames = list(numerics.FORMATS)
    for ax, be in zip(axes[0], backends):
        notes = []
        for (b, d, m), (fin, err, inok) in curves.items():
            if b != be:
                continue
            c = f"C{dnames.index(d)}"
            e = np.where(fin & inok, np.maximum(err, 1e-12), np.nan)
            ax.plot(scales, e, styles[m], color=c, label=f"{d} {m}")
            badx = scales[~fin & inok]
            if len(badx):
                ax.scatter(badx[:1], [30.0], marker="x", color=c, s=60, zorder=4)
                notes.append(f"{d} {m}: inf/NaN from s={badx[0]:.3g}")
        ax.text(0.02, 0.03, "\n".join(notes), transform=ax.transAxes, fontsize=6.5, va="bottom",
                bbox=dict(facecolor="white", alpha=0.8, lw=0))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(1e-17, 1e3)
        ax.set_xlabel("input magnitude s (max x = s)")
        ax.set_ylabel("max abs error vs float64 (x: first inf/NaN)")
        ax.set_title({"model": f"arithmetic in the format (NumPy emulation), n={n}",
                      "gpu": f"cuflash.softmax on the GPU (float32 arithmetic), n={n}"}[be], fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=3, loc="lower right")
    fig.tight_layout()
    bench.PLOTS.mkdir(parents=True, exist_ok=True)
    out = bench.PLOTS / f"{stem}.png"
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
