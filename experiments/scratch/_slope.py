"""Shared by softmax_slope_probe.py and norm_slope_probe.py (scratch): the copy timed at each size, and the fit of
time against bytes (read + written once) per (impl, dtype, length): slope = steady-state GB/s, intercept = the
fixed cost of one launch."""
import numpy as np
import cupy as cp

from cuflash import bench

MIBS = (64, 128, 256, 512)


def copy_rows(rnd, col, touch=False):
    """Rows of the device-to-device copy at every size of MIBS (``col``: the probe's length column, 0 here);
    ``touch``: write the destination once before timing."""
    rows = []
    for mib in MIBS:
        src = cp.empty(mib << 20, dtype=cp.uint8)
        dst = cp.empty_like(src)
        if touch:
            dst[...] = 1
        ms = bench.time_cuda(lambda: cp.copyto(dst, src), warmup=3, rep=30)["median_ms"]
        rows.append(dict(round=rnd, impl="copy", dtype="-", **{col: 0}, mib=mib, ms=ms))
        del src, dst
    return rows


def fit_report(out, col, name):
    """Print and return {(impl, dtype, length): (best ms per size, slope GB/s, intercept us)}; write the rows and
    fits to experiments/results/<name>_<commit>.json."""
    print(f"impl dtype {col} | ms at", MIBS, "| slope GB/s (r+w) | intercept us | frac of copy at 256 MiB")
    fits = {}
    for k in sorted({(r["impl"], r["dtype"], r[col]) for r in out}):
        ms = [min(r["ms"] for r in out if (r["impl"], r["dtype"], r[col]) == k and r["mib"] == m) for m in MIBS]
        slope, icpt = np.polyfit(np.array(MIBS, float) * 2 * (1 << 20), np.array(ms) * 1e-3, 1)
        fits[k] = (ms, 1 / slope / 1e9, icpt * 1e6)
    cms = fits[("copy", "-", 0)][0][MIBS.index(256)]
    for k, (ms, gb, us) in fits.items():
        print(*k, "|", " ".join("%.4f" % m for m in ms), "| %.0f | %.1f | %.3f" % (gb, us, cms / ms[MIBS.index(256)]))
    bench.write_results(f"{name}_{bench.git_commit()[:7]}", out, {"fits": {" ".join(map(str, k)): v
                                                                         for k, v in fits.items()}})
    return fits
