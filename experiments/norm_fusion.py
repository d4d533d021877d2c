"""Norms: the fused residual add + norm against a separate add and norm.

A pre-norm transformer block computes ``h = x + residual`` and ``y = norm(h)``. Fused
(``cuflash.layer_norm(x, ..., residual=r)`` / ``rms_norm``) it reads x and r and writes y and h: 4 passes over
``tokens x hidden``; separately it is an add (read x, r, write h) and a norm (read h, write y): 5 passes
(``cuflash.traffic.norm_bytes``). The plain norm (2 passes) and torch (add + F.layer_norm / F.rms_norm,
unfused) are timed beside them in the same run, with the copy bandwidth. Columns: latency, modeled GB/s, error
against the float64 reference, speed-up of fused over unfused and the ratio to torch.
Without a GPU (or with ``--predict``): the model only, roofline-predicted times, labelled PREDICTED, in
norm_fusion_predicted.json|csv and plots/norm_fusion_predicted.png: with ``--predict`` in experiments/results (or
``--out``), without a GPU and without ``--predict`` in ``--out`` or a new temporary folder it names (never over the
committed files). Exit status 0 either way. ``--quick`` changes the defaults of --shapes and --dtypes only (what is
given is kept).

    python experiments/norm_fusion.py [--quick] [--predict] [--ncu auto|on|off] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    default_help, fill_defaults, from_torch, name_list, nonnegative_int, output_dirs, positive_int, predicted_mode,
    predicted_watermark, print_results, pyplot, save_figure, scratch_out, to_torch)

import numpy as np  # noqa: E402

from cuflash import bench, gpus, ncu, traffic  # noqa: E402

VARIANTS = ("norm", "fused add+norm", "unfused add, norm", "torch add, norm")
DTYPES = ("bfloat16", "float32", "float16", "float64")
FULL = {"shapes": "16384x1024,16384x4096,8192x8192,4096x32768", "dtypes": "bfloat16,float32"}
QUICK = {"shapes": "4096x1024,2048x4096", "dtypes": "bfloat16"}


def shape_list(text):
    """argparse type: comma-separated TOKENSxHIDDEN, both positive (``"4096x1024,2048x4096"``); kept as the string."""
    import argparse

    for s in text.split(","):
        t = s.split("x")
        if len(t) != 2 or not all(v.isdigit() and int(v) > 0 for v in t):
            raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated TOKENSxHIDDEN, e.g. 4096x1024")
    return text


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=shape_list, help=default_help("tokens x hidden", "shapes", FULL, QUICK))
    ap.add_argument("--dtypes", type=name_list(DTYPES),
                    help=default_help(f"comma-separated, of {', '.join(DTYPES)}", "dtypes", FULL, QUICK))
    ap.add_argument("--kinds", type=name_list(("layer", "rms")), default="layer,rms")
    ap.add_argument("--rep", type=positive_int, default=20)
    ap.add_argument("--warmup", type=nonnegative_int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --shapes (4096x1024,2048x4096) and --dtypes (bfloat16), "
                         "not what is given")
    ap.add_argument("--predict", action="store_true")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--ncu", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plots", default=None)
    return fill_defaults(ap.parse_args(argv), FULL, QUICK)


def model(variant, kind, tokens, hidden, dt):
    if variant == "norm":
        return traffic.norm_bytes(tokens, hidden, dt, kind)
    if variant == "fused add+norm":
        return traffic.norm_bytes(tokens, hidden, dt, kind, residual=True, fused=True)
    return traffic.norm_bytes(tokens, hidden, dt, kind, residual=True, fused=False)


def run(a, plots, predicted):
    from cuflash import _dtypes

    g = gpus.get(a.gpu)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    jobs = [(k, dn, t, h) for k in a.kinds.split(",") for dn in a.dtypes.split(",") for t, h in shapes]
    use_ncu = (not predicted) and (a.ncu == "on" or (a.ncu == "auto" and not a.quick)) and ncu.available()
    rows = []
    env = {} if predicted else bench.environment()
    th = None
    if not predicted:
        import cupy as cp
        from tqdm import tqdm

        import cuflash
        from cuflash import reference
        from cuflash._attention_alt import from_float32

        copy_gbps = bench.copy_bandwidth(1 << 28, 20)
        if not a.no_torch:
            try:
                import torch

                th = torch if torch.cuda.is_available() else None
            except Exception:
                th = None
        bar = tqdm(total=len(jobs) * len(VARIANTS), desc="norm_fusion", unit="run")
    else:
        copy_gbps = g.copy_GBps()
        bar = None
    for kind, dn, tokens, hidden in jobs:
        dt = getattr(_dtypes, dn)
        s = np.dtype(dt).itemsize
        if not predicted:
            rs = cp.random.RandomState(2)
            x = from_float32(rs.standard_normal((tokens, hidden), dtype=cp.float32), dt)
            r_ = from_float32(rs.standard_normal((tokens, hidden), dtype=cp.float32), dt)
            w = from_float32(1 + 0.1 * rs.standard_normal(hidden, dtype=cp.float32), dt)
            b = from_float32(0.1 * rs.standard_normal(hidden, dtype=cp.float32), dt)
            flush = 4 * x.nbytes < 2 * (env.get("l2_bytes") or 60 * 2**20)
            xs, rs_, ws, bs = x[:4].get(), r_[:4].get(), w.get(), b.get()
            if kind == "layer":
                ref_n = reference.layer_norm(xs, (hidden,), ws, bs, 1e-5)[0]
                ref_f = reference.layer_norm(xs, (hidden,), ws, bs, 1e-5, residual=rs_)[0]

                def norm(h):
                    return cuflash.layer_norm(h, (hidden,), w, b, 1e-5)

                def fused(h, r):
                    return cuflash.layer_norm(h, (hidden,), w, b, 1e-5, residual=r)[0]

                def tnorm(h):
                    return th.nn.functional.layer_norm(h, (hidden,), tw, tb, 1e-5)
            else:
                ref_n = reference.rms_norm(xs, (hidden,), ws, 1e-6)[0]
                ref_f = reference.rms_norm(xs, (hidden,), ws, 1e-6, residual=rs_)[0]

                def norm(h):
                    return cuflash.rms_norm(h, (hidden,), w, 1e-6)

                def fused(h, r):
                    return cuflash.rms_norm(h, (hidden,), w, 1e-6, residual=r)[0]

                def tnorm(h):
                    return th.nn.functional.rms_norm(h, (hidden,), tw, 1e-6)
            if th is not None:
                tx, tr, tw, tb = (to_torch(th, v) for v in (x, r_, w, b))
        for variant in VARIANTS:
            if variant.startswith("torch") and (predicted or th is None):
                continue
            mv = "unfused add, norm" if variant.startswith("torch") else variant
            nb = model(mv, kind, tokens, hidden, dt)
            row = {"kernel": f"{kind}_norm", "variant": variant, "dtype": dn, "shape": f"{tokens}x{hidden}",
                   "tokens": tokens, "hidden": hidden, "bytes_model": nb, "passes_model": nb / (tokens * hidden * s)}
            if predicted:
                row.update(mode="predicted", predicted_for=g.name, ms=gpus.predict_time_s(nb, 0, g) * 1e3)
            else:
                row["mode"] = "measured"
                try:
                    if variant == "norm":
                        f, ref = (lambda: norm(x)), ref_n
                    elif variant == "fused add+norm":
                        f, ref = (lambda: fused(x, r_)), ref_f
                    elif variant == "unfused add, norm":
                        f, ref = (lambda: norm(x + r_)), ref_f
                    else:
                        def f():
                            return tnorm(tx + tr)
                        ref = ref_f
                    out = f()
                    out = from_torch(th, out) if th is not None and isinstance(out, th.Tensor) else out
                    e = bench.errors(out[:4], ref)
                    row.update(max_abs_err=e["max_abs_err"], max_rel_err=e["max_rel_err"])
                    row["ms"] = bench.time_cuda(f, warmup=a.warmup, rep=a.rep, flush=flush)["median_ms"]
                    if use_ncu and not variant.startswith("torch"):
                        fn = "layer_norm" if kind == "layer" else "rms_norm"
                        extra = "b, 1e-5" if kind == "layer" else "1e-6"
                        call = {"norm": f"cuflash.{fn}(x, ({hidden},), w, {extra})",
                                "fused add+norm": f"cuflash.{fn}(x, ({hidden},), w, {extra}, residual=r)",
                                "unfused add, norm": f"cuflash.{fn}(x + r, ({hidden},), w, {extra})"}[variant]
                        setup = (f"import cuflash\nfrom cuflash._attention_alt import from_float32\n"
                                 f"dt = cuflash._dtypes.{dn}\n"
                                 f"x, r = (from_float32(cupy.random.standard_normal(({tokens}, {hidden}), "
                                 f"dtype=cupy.float32), dt) for _ in range(2))\n"
                                 f"w, b = (from_float32(cupy.ones({hidden}, dtype=cupy.float32), dt) "
                                 f"for _ in range(2))\n")
                        m = ncu.try_measure(call, setup)
                        row.update(ncu.compare(m["bytes"] if m else None, nb))
                except Exception as ex:
                    row["error"] = f"{type(ex).__name__}: {ex}"[:300]
                    print(f"norm_fusion: {variant} {kind} {dn} {tokens}x{hidden}: {row['error']}")
                bar.update(1)
            if row.get("ms"):
                row["GBps_model"] = nb / (row["ms"] * 1e-3) / 1e9
                row["copy_fraction"] = row["GBps_model"] / copy_gbps
            rows.append(row)
    if bar:
        bar.close()
    # fused vs unfused speed-up and ratio to torch (same run, same shape)
    key = lambda r: (r["kernel"], r["dtype"], r["shape"])  # noqa: E731
    by = {}
    for r in rows:
        by.setdefault(key(r), {})[r["variant"]] = r.get("ms")
    for r in rows:
        d = by[key(r)]
        if r["variant"] == "fused add+norm" and r.get("ms") and d.get("unfused add, norm"):
            r["speedup_vs_unfused"] = d["unfused add, norm"] / r["ms"]
        if r.get("ms") and d.get("torch add, norm"):
            r["speed_vs_torch"] = d["torch add, norm"] / r["ms"]
    # a --quick run never replaces the committed full run's files: <name>_quick[_predicted]
    name = "norm_fusion" + ("_quick" if a.quick else "") + ("_predicted" if predicted else "")
    meta = {"predicted": predicted, "copy_GBps": copy_gbps, "ncu": use_ncu, "args": vars(a),
            "note": "PREDICTED: time = modeled bytes / copy bandwidth" if predicted else
                    "GBps_model = cuflash.traffic.norm_bytes / time; copy measured in the same run"}
    path = bench.write_results(name, rows, meta)
    label = f"PREDICTED for {g.name} (model, no GPU)" if predicted else f"{env.get('gpu')} (measured)"
    plot(rows, plots / f"{name}.png", label)
    return path, rows


def plot(rows, path, label):
    plt = pyplot()

    groups = list(dict.fromkeys((r["kernel"], r["dtype"]) for r in rows))
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(5.5 * max(len(groups), 1), 4.2), squeeze=False)
    for ax, (kern, dn) in zip(axes[0], groups):
        rr = [r for r in rows if r["kernel"] == kern and r["dtype"] == dn]
        shp = list(dict.fromkeys(r["shape"] for r in rr))
        vs = list(dict.fromkeys(r["variant"] for r in rr))
        w = 0.8 / max(len(vs), 1)
        for i, v in enumerate(vs):
            y = [next((r.get("ms") or 0 for r in rr if r["shape"] == s and r["variant"] == v), 0) for s in shp]
            ax.bar(np.arange(len(shp)) + i * w, y, w, label=v)
        ax.set_xticks(np.arange(len(shp)) + 0.4 - w / 2)
        ax.set_xticklabels(shp, rotation=20, fontsize=8)
        ax.set_ylabel("ms")
        ax.set_title(f"{kern} {dn}")
        ax.legend(fontsize=7)
    fig.suptitle(f"Residual add + norm: fused (4 passes) vs separate (5 passes) — {label}")
    predicted_watermark(fig, label)
    save_figure(fig, path, dpi=110, mkdir=False)


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if not (a.predict or bench.has_gpu()):
        scratch_out(a, "norm_fusion")
    plots = output_dirs(a)
    predicted = predicted_mode(a, f"norm_fusion: no CUDA device: model with roofline-predicted times for {a.gpu} "
                                  f"(PREDICTED)")
    path, rows = run(a, plots, predicted)
    print_results(path, rows, ("kernel", "variant", "dtype", "shape", "passes_model", "ms", "GBps_model",
                               "speedup_vs_unfused", "speed_vs_torch", "measured_over_modeled", "max_abs_err"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
