"""Tile sweep of the FA-2 attention forward: HBM traffic against runtime for every (Br, Bc).

The FlashAttention-2 schedule reads Q once and K, V once per Q tile: HBM bytes per (batch, head) are
``2·Sq·d·s + 4·Sq + 2·ceil(Sq/Br)·Sk·d·s`` (s = element size; ``cuflash.traffic.attention_bytes``), so a
larger Br means less traffic, while Br and Bc together set shared memory, registers and occupancy. This script
runs the forward for every instantiated (Br, Bc) that fits the device's shared memory, times it with CUDA
events (warm-up, median of >= 20), reports TFLOP/s (4·B·H·N²·d, halved when causal), the modeled HBM bytes
and, with ``--ncu`` (and ``ncu`` on PATH), the DRAM bytes measured by Nsight Compute
(dram__bytes_read.sum + dram__bytes_write.sum of one launch, via ``cuflash.ncu``; without it the script re-runs
itself under ``ncu`` in ``--single`` mode). ncu flushes caches before the profiled launch, so measured bytes
are cold-L2 DRAM bytes: K/V re-reads by later Q tiles of the same head mostly hit the 60 MB L2 and the
measured bytes fall below the model, which counts every tile read as HBM traffic.

Writes experiments/results/attention_tile_sweep.json|csv and plots/attention_tile_sweep.png.
Without a GPU (or with ``--predict``) it writes the model-only PREDICTED version of the sweep instead: every
instantiated (Br, Bc, warps) that fits ``--gpu``'s shared memory, at its roofline-predicted time
(``cuflash.gpus.predict_time_s``: max(modeled bytes / copy bandwidth, FLOPs / matmul peak) from the GPU table),
to attention_tile_sweep_predicted.json|csv and plots/attention_tile_sweep_predicted.png. Without a GPU the exit
status stays 2 (no measurement was made) and, unless ``--out`` names a folder, those files go to a new temporary
folder (the committed ones are left alone); with an explicit ``--predict`` the exit status is 0 and they go to
experiments/results (or ``--out``). A ``--quick`` run is named attention_tile_sweep_quick (results and plot)
unless ``--name`` is given, so it never replaces the full run's files.

    python experiments/tile_sweep.py                    # batch 4, heads 16, seqlen 4096, head_dim 64 and 128, bf16
    python experiments/tile_sweep.py --quick            # smoke size
    python experiments/tile_sweep.py --ncu --causal     # with measured DRAM bytes, causal mask
    python experiments/tile_sweep.py --predict [--gpu H200] [--out DIR]   # model only, no GPU use
    python experiments/tile_sweep.py --replot [--predict]   # redraw the plot from the results JSON (exit 0)
    cuflash sweep [same args]
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    add_replot_arg, default_help, fill_defaults, load_results, nonnegative_int, output_dirs, positive_int, pyplot,
    run_names, sample_ref, save_figure, scratch_out)

NCU_METRICS = "dram__bytes_read.sum,dram__bytes_write.sum"
FULL = {"batch": 4, "heads": 16, "seqlen": 4096, "rep": 30, "warmup": 5}
QUICK = {"batch": 1, "heads": 4, "seqlen": 1024, "rep": 20, "warmup": 2}
MIN_REP = 20  # medians of at least this many launches


def model_bytes(batch, heads, seqlen, head_dim, Br, Bc, dtype, causal):
    """HBM bytes of the FA-2 forward (cuflash.traffic when present, else the no-mask/causal closed form)."""
    try:
        from cuflash import traffic

        return int(traffic.attention_bytes("fa2", batch, heads, seqlen, seqlen, head_dim, Br, Bc, dtype, causal))
    except Exception:  # traffic.py missing or older: the same count, written out
        s = np.dtype(dtype).itemsize
        Tr = math.ceil(seqlen / Br)
        kv = 0
        for i in range(Tr):
            hi = min(seqlen, (i + 1) * Br) if causal else seqlen
            kv += 2 * hi * head_dim * s
        return int(batch * heads * (2 * seqlen * head_dim * s + 4 * seqlen + kv))


def parse_args(argv):
    from cuflash._attn_common import NATIVE_HEAD_DIMS

    # argparse's prog: the script's file name, or "cuflash sweep" when cuflash/cli.py runs it (sets sys.argv[0])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=positive_int, help=default_help("batch size", "batch", FULL, QUICK))
    ap.add_argument("--heads", type=positive_int, help=default_help("attention heads", "heads", FULL, QUICK))
    ap.add_argument("--seqlen", type=positive_int, help=default_help("seqlen_q = seqlen_k", "seqlen", FULL, QUICK))
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=NATIVE_HEAD_DIMS,
                    metavar="HEAD_DIM", help=f"head_dims to sweep, each of {NATIVE_HEAD_DIMS} (default 64 128)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                    help="the swept tiles are instantiated for bfloat16; float16 times the default tile only "
                         "(default bfloat16)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rep", type=positive_int,
                    help=default_help(f"timed repetitions, median reported (fewer than {MIN_REP} are raised to "
                                      f"{MIN_REP}, said when it happens)", "rep", FULL, QUICK))
    ap.add_argument("--warmup", type=nonnegative_int,
                    help=default_help("untimed calls before the timed ones", "warmup", FULL, QUICK))
    ap.add_argument("--ncu", action="store_true", help="also measure DRAM bytes with Nsight Compute")
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --batch, --heads, --seqlen, --rep, --warmup (not what "
                         "is given); results and plot named attention_tile_sweep_quick unless --name")
    ap.add_argument("--single", default=None, help=argparse.SUPPRESS)  # "d,Br,Bc,warps": one launch (ncu)
    ap.add_argument("--name", default=None,
                    help="results/plot file stem (default attention_tile_sweep; attention_tile_sweep_quick with "
                         "--quick); _predicted is appended for the model-only sweep")
    ap.add_argument("--predict", action="store_true", help="model only (no GPU use): roofline-predicted times")
    ap.add_argument("--gpu", default="H200", help="GPU table entry for predicted times: H200 (default), H100, A100")
    ap.add_argument("--out", default=None, help="results folder (default experiments/results; without a GPU and "
                                                "--predict a new temporary folder); plots go to OUT/plots unless "
                                                "--plots")
    ap.add_argument("--plots", default=None, help="plots folder")
    add_replot_arg(ap, "attention_tile_sweep (with --predict: attention_tile_sweep_predicted)", out=True)
    a = fill_defaults(ap.parse_args(argv), FULL, QUICK)
    run_names(a, "attention_tile_sweep", "attention_tile_sweep")
    if a.rep < MIN_REP:
        print(f"tile_sweep: --rep {a.rep} raised to {MIN_REP} (medians of at least {MIN_REP} launches)")
        a.rep = MIN_REP
    return a


def run_predicted(a, plots):
    """The model-only sweep: modeled bytes and FLOPs of every instantiated configuration, roofline time for
    ``a.gpu``; writes ``<name>_predicted.json|csv`` and its plot. Returns (path, rows)."""
    from cuflash import bench, gpus
    A = importlib.import_module("cuflash.attention")
    from cuflash._dtypes import bfloat16

    g = gpus.get(a.gpu)
    dt = bfloat16 if a.dtype == "bfloat16" else np.dtype(np.float16)
    limit = g.smem_optin_per_block
    rows, skipped = [], []
    for d in a.head_dims:
        for br, bc, w in A.instantiated_tiles(dt, d):
            smem = A.smem_bytes(dt, d, br, bc)
            if smem > limit:
                skipped.append({"head_dim": d, "Br": br, "Bc": bc, "warps": w, "smem_bytes": smem})
                continue
            fl = A.flops(a.batch, a.heads, a.seqlen, a.seqlen, d, a.causal)
            mb = model_bytes(a.batch, a.heads, a.seqlen, d, br, bc, a.dtype, a.causal)
            t = gpus.predict_time_s(mb, fl, g, a.dtype)
            t_mem = mb / (g.copy_GBps() * 1e9)
            t_cmp = fl / (g.matmul_TFLOPs(a.dtype) * 1e12)
            rows.append({"head_dim": d, "Br": br, "Bc": bc, "warps": w, "rows_per_warp": br // w, "stages": A.STAGES,
                         "smem_bytes": smem, "default": (br, bc, w) == A.DEFAULT_TILES.get((d, a.causal)),
                         "batch": a.batch, "heads": a.heads, "seqlen": a.seqlen, "dtype": a.dtype,
                         "causal": a.causal, "mode": "predicted", "predicted_for": g.name,
                         "ms": t * 1e3, "tflops": fl / t / 1e12, "flops": fl, "model_bytes": mb,
                         "model_GBps": mb / t / 1e9, "bound": "memory" if t_mem >= t_cmp else "compute"})
    name = f"{a.name}_predicted"
    meta = {"predicted": True, "mode": "PREDICTED: model only, no GPU measurement",
            "what": "FA-2 forward tile sweep, PREDICTED: modeled HBM bytes and roofline time per (Br, Bc, warps)",
            "gpu_table": g.name, "gpu_notes": g.notes, "copy_GBps": g.copy_GBps(),
            "matmul_TFLOPs": g.matmul_TFLOPs(a.dtype), "smem_limit_bytes": limit,
            "skipped_smem": skipped, "flops": "4*B*H*N^2*d (halved when causal)",
            "model": "cuflash.traffic.attention_bytes('fa2', ...): every K/V tile read counted as HBM traffic "
                     "(no L2 reuse), so the model is pessimistic where the measured sweep's K/V re-reads hit L2",
            "time": "cuflash.gpus.predict_time_s: max(bytes / copy BW, flops / matmul peak), a lower bound "
                    "(no latency, launch overhead or imperfect overlap)",
            "args": vars(a),
            "note": f"PREDICTED for {g.name} (model only, no GPU): traffic model + roofline time from the "
                    f"cuflash/gpus.py table; not a measurement"}
    path = bench.write_results(name, rows, meta)
    plot(rows, a, plots / f"{name}.png", time_key="ms", predicted_for=g.name)
    return path, rows


def _inputs(cp, a, d, dt, seed=0):
    rng = cp.random.default_rng(seed)
    shape = (a.batch, a.heads, a.seqlen, d)
    return [rng.standard_normal(shape, dtype=np.float32).astype(dt) for _ in range(3)]


def run_single(a) -> int:
    """One warm-up launch and one profiled launch of a configuration (what ncu measures: the 2nd launch)."""
    import cupy as cp
    from cuflash._dtypes import bfloat16
    from cuflash.attention import attention

    d, br, bc, w = (int(x) for x in a.single.split(","))
    dt = bfloat16 if a.dtype == "bfloat16" else np.dtype(np.float16)
    q, k, v = _inputs(cp, a, d, dt)
    for _ in range(2):
        attention(q, k, v, causal=a.causal, block_sizes=(br, bc, w))
    cp.cuda.Device().synchronize()
    return 0


def _ncu_available() -> bool:
    try:
        from cuflash import ncu as ncu_mod

        return ncu_mod.available()
    except ImportError:
        return shutil.which("ncu") is not None


def ncu_bytes(a, d, br, bc, w):
    """DRAM bytes (read + write) of the 2nd launch of configuration (d, Br, Bc, warps), or None when ncu fails."""
    try:  # the shared helper (profiles only the call, after a warm-up in the setup)
        from cuflash import ncu as ncu_mod

        setup = (f"import numpy as np, cupy as cp\nfrom cuflash.attention import attention\n"
                 f"from cuflash._dtypes import bfloat16\ndt = bfloat16 if {a.dtype!r} == 'bfloat16' else np.float16\n"
                 f"rng = np.random.default_rng(0)\n"
                 f"q, k, v = (cp.asarray(rng.standard_normal(({a.batch}, {a.heads}, {a.seqlen}, {d}), "
                 f"dtype=np.float32)).astype(dt) for _ in range(3))\n"
                 f"attention(q, k, v, causal={a.causal}, block_sizes=({br}, {bc}, {w}))")
        r = ncu_mod.try_measure(f"attention(q, k, v, causal={a.causal}, block_sizes=({br}, {bc}, {w}))", setup,
                                kernel_regex="attention_fwd_kernel")
        return int(r["bytes"]) if r else None
    except ImportError:
        pass
    ncu = shutil.which("ncu")  # fallback: re-run this script in --single mode under ncu
    if not ncu:
        return None
    cmd = [ncu, "--clock-control", "none", "--metrics", NCU_METRICS, "--csv", "--kernel-name", "regex:attention_fwd",
           "--launch-skip", "1", "--launch-count", "1",
           sys.executable, str(Path(__file__).resolve()), "--single", f"{d},{br},{bc},{w}",
           "--batch", str(a.batch), "--heads", str(a.heads), "--seqlen", str(a.seqlen), "--dtype", a.dtype]
    if a.causal:
        cmd.append("--causal")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    except Exception as e:
        print(f"ncu failed for d={d} Br={br} Bc={bc} warps={w}: {e}", file=sys.stderr)
        return None
    return parse_ncu_csv(r.stdout)


_UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
          "kibyte": 1024, "mibyte": 1024**2, "gibyte": 1024**3}


def parse_ncu_csv(text: str):
    """Sum dram__bytes_read.sum + dram__bytes_write.sum from ncu --csv output (units converted to bytes)."""
    import csv
    import io

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return None
    total, seen = 0.0, 0
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        name = row.get("Metric Name", "")
        if name in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            unit = (row.get("Metric Unit") or "byte").strip().lower()
            val = float((row.get("Metric Value") or "nan").replace(",", ""))
            total += val * _UNITS.get(unit, 1)
            seen += 1
    return int(total) if seen == 2 else None


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from cuflash import bench

    if a.replot:
        return replot(a)
    gpu = False if a.predict else bench.has_gpu()
    if not gpu:
        if not a.predict:
            print("tile_sweep: no CUDA device visible (run on the GPU machine)")
        if a.single:
            return 2
        if not a.predict:
            scratch_out(a, "tile_sweep")
        plots = output_dirs(a)
        print(f"tile_sweep: writing the model-only PREDICTED sweep for {a.gpu} (no GPU measurement)")
        path, rows = run_predicted(a, plots)
        print(bench.table(rows, ["head_dim", "Br", "Bc", "warps", "default", "ms", "tflops", "model_bytes", "bound"]))
        print(f"wrote {path} and {plots / (path.stem + '.png')} (PREDICTED)")
        return 0 if a.predict else 2
    if a.single:
        return run_single(a)
    plots = output_dirs(a)
    import cupy as cp
    from tqdm import tqdm
    from cuflash import _compile
    A = importlib.import_module("cuflash.attention")
    from cuflash._dtypes import bfloat16

    dt = bfloat16 if a.dtype == "bfloat16" else np.dtype(np.float16)
    dev = cp.cuda.runtime.getDevice()
    limit = _compile.max_shared_optin(dev)
    configs = [(d, br, bc, w) for d in a.head_dims for (br, bc, w) in A.instantiated_tiles(dt, d)
               if A.smem_bytes(dt, d, br, bc) <= limit]
    use_ncu = a.ncu and _ncu_available()
    if a.ncu and not use_ncu:
        print("tile_sweep: --ncu given but ncu is not on PATH; measured bytes left empty")
    rows = []
    inputs = {}
    sample = np.unique(np.linspace(0, a.seqlen - 1, 48).astype(int))  # query rows checked against float64
    for d, br, bc, w in tqdm(configs, desc="tile sweep", unit="cfg"):
        if d not in inputs:
            inputs.clear()
            q, k, v = _inputs(cp, a, d, dt)
            inputs[d] = (q, k, v, sample_ref(q, k, v, a.causal, sample))
        q, k, v, ref = inputs[d]
        fn = lambda: A.attention(q, k, v, causal=a.causal, block_sizes=(br, bc, w))  # noqa: E731
        err = float(cp.abs(fn()[0][:, sample].astype(cp.float64) - ref).max())
        t = bench.time_cuda(fn, warmup=a.warmup, rep=a.rep)
        fl = A.flops(a.batch, a.heads, a.seqlen, a.seqlen, d, a.causal)
        mb = model_bytes(a.batch, a.heads, a.seqlen, d, br, bc, a.dtype, a.causal)
        row = {"head_dim": d, "Br": br, "Bc": bc, "warps": w, "rows_per_warp": br // w, "stages": A.STAGES,
               "smem_bytes": A.smem_bytes(dt, d, br, bc), "default": (br, bc, w) == A.DEFAULT_TILES[(d, a.causal)],
               "batch": a.batch, "heads": a.heads, "seqlen": a.seqlen, "dtype": a.dtype, "causal": a.causal,
               "median_ms": t["median_ms"], "p20_ms": t["p20_ms"], "p80_ms": t["p80_ms"],
               "tflops": fl / (t["median_ms"] * 1e-3) / 1e12, "model_bytes": mb,
               "model_GBps": mb / (t["median_ms"] * 1e-3) / 1e9, "max_abs_err": err, "ncu_dram_bytes": None}
        if use_ncu:
            row["ncu_dram_bytes"] = ncu_bytes(a, d, br, bc, w)
        rows.append(row)
    inputs.clear()
    meta = {"what": "FA-2 forward tile sweep: runtime, TFLOP/s, modeled and measured HBM bytes per (Br, Bc)",
            "error": "max_abs_err: max |out - float64 reference| over 48 query rows x all heads of batch 0",
            "flops": "4*B*H*N^2*d (halved when causal)", "timing": f"CUDA events, warmup {a.warmup}, median of {a.rep}",
            "model": "cuflash.traffic.attention_bytes('fa2', ...)", "ncu_metrics": NCU_METRICS if use_ncu else None,
            "smem_limit_bytes": limit}
    path = bench.write_results(a.name, rows, meta)
    print(bench.table(rows, ["head_dim", "Br", "Bc", "warps", "default", "median_ms", "tflops", "max_abs_err",
                             "model_bytes", "ncu_dram_bytes"]))
    for d in a.head_dims:
        rs = [r for r in rows if r["head_dim"] == d]
        if rs:
            best = min(rs, key=lambda r: r["median_ms"])
            dflt = next((r for r in rs if r["default"]), None)
            note = f" (default {dflt['Br']}x{dflt['Bc']}/{dflt['warps']}w: {dflt['tflops']:.0f})" if dflt else ""
            print(f"head_dim {d}: fastest Br={best['Br']} Bc={best['Bc']} warps={best['warps']} "
                  f"{best['tflops']:.0f} TFLOP/s{note}")
    plot(rows, a, plots / f"{a.name}.png")
    print(f"wrote {path} and plots/{a.name}.png")
    return 0


def replot(a) -> int:
    """Redraw ``plots/<name>.png`` (``<name>_predicted`` with --predict) from the results JSON; no GPU use."""
    import argparse as _ap

    plots = output_dirs(a)
    name = f"{a.name}_predicted" if a.predict else a.name
    doc = load_results(name, a.out)
    rows = doc["rows"]
    if not rows:
        print(f"tile_sweep: no rows in {name}.json")
        return 1
    r0 = rows[0]
    shape = _ap.Namespace(batch=r0["batch"], heads=r0["heads"], seqlen=r0["seqlen"], dtype=r0["dtype"],
                          causal=r0["causal"])
    if a.predict or r0.get("mode") == "predicted":
        plot(rows, shape, plots / f"{name}.png", time_key="ms",
             predicted_for=r0.get("predicted_for") or doc["meta"].get("gpu_table") or a.gpu)
    else:
        plot(rows, shape, plots / f"{name}.png")
    print(f"wrote {plots / (name + '.png')}")
    return 0


def _place_labels(ax, pts, texts, box=(78, 24)):
    """Greedy label placement (adjustText-like, no dependency): for each point, in order, the first offset
    (in points) from a fixed candidate list whose label box stays inside the axes and overlaps neither an
    earlier label nor a marker; a thin leader line joins every label to its point. ``pts`` in data
    coordinates; ``texts`` (label, is_default) pairs."""
    fig = ax.figure
    fig.canvas.draw()  # fix the limits / transforms
    to_pt = 72.0 / fig.dpi
    disp = [ax.transData.transform(p) * to_pt for p in pts]  # display points (1/72 in)
    (x0, y0), (x1, y1) = ax.transAxes.transform([(0, 0), (1, 1)]) * to_pt
    w, h = box
    cands = [(10, 8), (10, -h - 8), (-w - 10, 8), (-w - 10, -h - 8)]
    for k in range(1, 4):
        cands += [(10, 8 + k * (h + 6)), (10, -h - 8 - k * (h + 6)), (-w - 10, 8 + k * (h + 6)),
                  (-w - 10, -h - 8 - k * (h + 6))]
    taken = [(x - 5, y - 5, x + 5, y + 5) for x, y in disp]  # the markers themselves

    def free(bx):
        inside = bx[0] >= x0 + 2 and bx[2] <= x1 - 2 and bx[1] >= y0 + 2 and bx[3] <= y1 - 2
        return inside and all(bx[2] <= t[0] or bx[0] >= t[2] or bx[3] <= t[1] or bx[1] >= t[3] for t in taken)

    order = sorted(range(len(pts)), key=lambda i: (disp[i][0], disp[i][1]))
    for i in order:
        x, y = disp[i]
        for dx, dy in cands:
            bx = (x + dx, y + dy, x + dx + w, y + dy + h)
            if free(bx):
                break
        else:
            dx, dy = cands[0]
            bx = (x + dx, y + dy, x + dx + w, y + dy + h)
        taken.append(bx)
        ax.annotate(texts[i][0], pts[i], xytext=(dx, dy), textcoords="offset points", fontsize=7, ha="left",
                    va="bottom", fontweight="bold" if texts[i][1] else "normal",
                    color="C3" if texts[i][1] else "black",
                    arrowprops=dict(arrowstyle="-", lw=0.6, color="0.45", shrinkA=1, shrinkB=4))


def plot(rows, a, path, time_key="median_ms", predicted_for=None):
    """HBM bytes against time, one panel per head_dim, one labelled point per configuration (label:
    Br x Bc / warps and TFLOP/s, staggered so none overlaps; the default tile a red star, bold red label);
    ``predicted_for`` (a GPU table name) marks the figure PREDICTED and ``time_key`` names the time column
    ("ms" for predicted rows)."""
    plt = pyplot()

    dims = sorted({r["head_dim"] for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(7 * len(dims), 5.2), squeeze=False)
    labels = []
    for ax, d in zip(axes[0], dims):
        rs = [r for r in rows if r["head_dim"] == d]
        for key, marker, label in (("model_bytes", "o", "modeled HBM bytes"),
                                   ("ncu_dram_bytes", "s", "ncu DRAM bytes")):
            pts = [(r[time_key], r[key]) for r in rs if r.get(key)]
            if not pts:
                continue
            ax.scatter([p[0] for p in pts], [p[1] / 1e6 for p in pts], marker=marker, label=label,
                       facecolors="none" if key == "ncu_dram_bytes" else None,
                       edgecolors="C1" if key == "ncu_dram_bytes" else None, zorder=3)
        dflt = [r for r in rs if r["default"]]
        if dflt:
            ax.scatter([r[time_key] for r in dflt], [r["model_bytes"] / 1e6 for r in dflt], marker="*", s=220,
                       color="C3", edgecolors="k", linewidths=0.6, zorder=4, label="default tile")
        if predicted_for is None:
            pts = [(r[time_key], r["model_bytes"] / 1e6) for r in rs]
            texts = [(f"{r['Br']}x{r['Bc']}/{r['warps']}w{' (default)' if r['default'] else ''}\n"
                      f"{r['tflops']:.0f} TFLOP/s", r["default"]) for r in rs]
        else:  # the model gives configurations of one Br the same point: one label listing them all
            groups = {}
            for r in rs:
                groups.setdefault((round(r[time_key], 9), r["model_bytes"]), []).append(r)
            pts, texts = [], []
            for (t, mb), grp in groups.items():
                names = ", ".join(f"{r['Br']}x{r['Bc']}/{r['warps']}w{'*' if r['default'] else ''}" for r in grp)
                pts.append((t, mb / 1e6))
                texts.append((f"{names}\n{grp[0]['tflops']:.0f} TF/s ({grp[0].get('bound', '')}-bound)",
                              any(r["default"] for r in grp)))
        ax.margins(x=0.3 if predicted_for is not None else 0.2, y=0.25)
        ax.set_xlabel("runtime (ms, median)" if predicted_for is None else
                      f"predicted runtime (ms, roofline for {predicted_for})")
        ax.set_ylabel("HBM traffic (MB, model)")
        ax.set_title(f"head_dim {d}: B={a.batch} H={a.heads} N={a.seqlen} {a.dtype}"
                     f"{' causal' if a.causal else ''}", fontsize=9)
        ax.grid(alpha=0.3)
        labels.append((ax, pts, texts, (78, 24) if predicted_for is None else (150, 24)))
    title = "FA-2 forward tile sweep: one point per (Br, Bc, warps), label = tile and TFLOP/s (red star = default)"
    if predicted_for is not None:
        title = (f"FA-2 forward tile sweep — PREDICTED (model, no GPU) for {predicted_for}: one point per "
                 f"(Br, Bc, warps), the model puts configurations of one Br on the same point (* = default)")
        fig.text(0.5, 0.5, "PREDICTED (model, no GPU)", color="red", alpha=0.18, fontsize=32, ha="center",
                 va="center", rotation=15)
    fig.suptitle(title, fontsize=10)
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=max(1, len(lab)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))  # the final axes geometry before the labels are placed
    for ax, pts, texts, box in labels:
        _place_labels(ax, pts, texts, box)
    save_figure(fig, path, rect=(0, 0.05, 1, 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
