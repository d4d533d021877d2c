"""Experiment 1 — float formats: float32, float16, bfloat16, float8 e4m3fn and e5m2, side by side.

For each format: exponent and mantissa bits, largest finite value, smallest normal and subnormal, machine
epsilon, decimal digits (p·log10 2) and dynamic range in decades — derived from the bit layout by
``cuflash.numerics.format_info`` and cross-checked here against ``ml_dtypes.finfo`` / ``numpy.finfo``.
The figure plots range (log2 of the smallest subnormal to log2 of the largest finite) against precision:
bfloat16 keeps float32's range with 8 bits of precision; float16 trades range for 3 more bits.
Pure CPU (no GPU needed). Writes experiments/results/numerics_formats.json|csv and plots/numerics_formats.png; a
--quick run writes numerics_formats_quick (results and plot) and a run under --name <name>, never the committed files.

    python experiments/numerics_formats.py [--quick] [--name NAME]
    python experiments/numerics_formats.py --replot   # redraw plots/numerics_formats.png from the results JSON
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/_common.py

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from _common import add_replot_arg, load_results, run_names  # noqa: E402
from cuflash import bench, numerics  # noqa: E402


def finfo(dt):
    dt = np.dtype(dt)
    return np.finfo(dt) if dt in (np.float16, np.float32, np.float64) else ml_dtypes.finfo(dt)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke size (the table is the same; kept for symmetry): writes numerics_formats_quick")
    ap.add_argument("--name", default=None,
                    help="results and plot file stem (default numerics_formats; numerics_formats_quick with --quick)")
    add_replot_arg(ap, "numerics_formats")
    args = ap.parse_args(argv)
    stem = run_names(args, "numerics_formats", "numerics_formats")
    if args.replot:
        plot(load_results(args.name)["rows"], stem)
        return 0
    rows = []
    for name, dt in tqdm(list(numerics.FORMATS.items()), desc="formats"):
        info = numerics.format_info(dt)
        fi = finfo(dt)
        agree = (info["max"] == float(fi.max) and info["smallest_normal"] == float(fi.smallest_normal)
                 and info["smallest_subnormal"] == float(fi.smallest_subnormal) and info["eps"] == float(fi.eps)
                 and info["mantissa_bits"] == fi.nmant and info["exponent_bits"] == fi.nexp)
        rows.append({k: info[k] for k in ("name", "bits", "exponent_bits", "mantissa_bits", "max", "smallest_normal",
                                          "smallest_subnormal", "eps", "unit_roundoff", "decimal_digits",
                                          "range_decades", "has_inf")} | {"matches_finfo": bool(agree)})
    print(bench.table(rows, ["name", "bits", "exponent_bits", "mantissa_bits", "max", "smallest_normal",
                             "smallest_subnormal", "eps", "decimal_digits", "range_decades", "matches_finfo"]))
    path = bench.write_results(args.name, rows, {"source": "cuflash.numerics.format_info (bit layout)",
                                                 "checked_against": "ml_dtypes.finfo / numpy.finfo"})
    print("wrote", path)
    plot(rows, stem)
    if not all(r["matches_finfo"] for r in rows):
        print("MISMATCH against finfo:", [r["name"] for r in rows if not r["matches_finfo"]])
        return 1
    return 0


def plot(rows, stem="numerics_formats"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(rows):
        y = r["mantissa_bits"] + 1
        lo, nlo, hi = math.log2(r["smallest_subnormal"]), math.log2(r["smallest_normal"]), math.log2(r["max"])
        c = colors[i % len(colors)]
        ax.plot([lo, nlo], [y, y], color=c, lw=3, alpha=0.35)  # subnormal range: precision tapers off
        ax.plot([nlo, hi], [y, y], color=c, lw=6, solid_capstyle="butt", label=f"{r['name']} (eps={r['eps']:.3g})")
        ax.annotate(f"{r['name']}: max {r['max']:.4g}, {r['decimal_digits']:.1f} digits", (hi, y),
                    textcoords="offset points", xytext=(4, -10 if r["name"] == "float8_e5m2" else 4), fontsize=7)
    ax.set_xlabel("log2 |value| (thin: subnormals, thick: normal range)")
    ax.set_ylabel("precision p = mantissa bits + 1")
    ax.set_title("Floating-point formats: range against precision")
    ax.grid(alpha=0.3)
    # the legend sits in the empty band between float32 (p = 24) and float16 (p = 11), clear of every bar and label
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(0.01, 0.66))
    ax.set_xlim(-160, 175)
    ax.set_ylim(1, 26)  # room for the labels of the top and bottom bars
    fig.tight_layout()
    bench.PLOTS.mkdir(parents=True, exist_ok=True)
    out = bench.PLOTS / f"{stem}.png"
    fig.savefig(out, dpi=130)
    plt.close(fig)
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
