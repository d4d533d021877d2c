"""Turn the committed results (``experiments/results/*.json``) into one Markdown report (``experiments/REPORT.md``).

The report opens with the table every kernel is judged by — kernel, shape, dtype, max abs err, max rel err,
latency, GB/s or TFLOP/s, and the ratio to the peer/anchor measured in the same run — gathered from every
results file that has those columns, then one section per results file (environment: GPU, commit, command,
date; a table of its rows; its plots from ``plots/``), then the GPU test records (``*_tests.json``).
The modeled vs measured HBM bytes of every kernel (``traffic_check.json`` from experiments/traffic_check.py, else
its PREDICTED version) get their own table right after the judged one.
It reads whatever exists and skips what is missing or unreadable; files made without a GPU (``*_predicted``,
or ``meta.predicted``) are labelled PREDICTED everywhere they appear.

Every row of the judged table says what it is: files whose rows carry no ``kernel``/``shape`` columns get a label
made from their own columns (``LABELERS``: e.g. the tile sweep's "attention fa2 128×64/4w", shape
"B4 H16 N4096 d64"; the attention benches' one-row-per-shape files become one row per cuflash kernel with its
ratio to the torch peers of the same run), and the ratio column carries the same-run peer ratio (``*_vs_*``,
``speed_*``, ``frac_*``, or one computed from a peer row of the same file). Measured files come first; a file with
more than ``PER_SOURCE`` judged rows shows its cuflash rows first and the rest in its own section.

    python experiments/report.py [--results DIR] [--plots DIR] [--out FILE]
    cuflash report [same options]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ID_COLS = ("kernel", "impl", "method", "variant", "schedule", "path", "name", "config", "figure", "Br", "Bc",
           "head_dim", "causal", "seqlen", "mode")
LAT_COLS = ("ms", "median_ms", "fwd_ms", "latency_ms", "time_ms", "fwdbwd_ms", "us")
THRU_RE = re.compile(r"^(gbps|tflops|gb_s|tflop_s|achieved)", re.I)
RATIO_RE = re.compile(r"(vs_|_vs|speed|ratio|over_|frac|speedup)", re.I)
ERR_COLS = ("max_abs_err", "max_rel_err")
TITLES = {"attention_tile_sweep": "Attention tile sweep", "fig2": "FlashAttention Fig. 2 on this GPU",
          "softmax_passes": "Softmax methods: passes vs time", "norm_fusion": "Fused residual + norm",
          "roofline": "Roofline"}
MAX_ROWS = 80
PER_SOURCE = 40   # judged-table rows per results file (the rest are in the file's own section)
# Section-table columns for files whose rows the generic picker labels badly (only those present are shown).
SECTION_COLS = {
    "attention_tile_sweep": ("head_dim", "Br", "Bc", "warps", "default", "causal", "batch", "heads", "seqlen",
                             "dtype", "median_ms", "ms", "tflops", "max_abs_err", "model_bytes", "model_GBps",
                             "ncu_dram_bytes",
                             "bound", "predicted_for"),
    "attention_bench": ("head_dim", "causal", "seqlen", "batch", "heads", "dtype", "tiles", "cuflash_ms",
                        "cuflash_tflops", "cuflash_err", "wgmma_tflops", "torch_flash_tflops", "torch_cudnn_tflops",
                        "ratio_vs_flash", "ratio_vs_cudnn", "wgmma_ratio_vs_flash"),
    "attention_bwd_bench": ("head_dim", "causal", "seqlen", "batch", "heads", "dtype", "deterministic",
                            "cuflash_bwd_ms", "cuflash_bwd_tflops", "torch_flash_bwd_tflops", "cuflash_fwdbwd_ms",
                            "cuflash_fwdbwd_tflops", "torch_flash_fwdbwd_tflops", "ratio_fwdbwd_vs_flash",
                            "ratio_fwdbwd_vs_cudnn", "dq_err", "dq_vs_flash"),
    "attention_sm90_bench": ("head_dim", "causal", "seqlen", "batch", "heads", "dtype", "sm90_variant", "sm90_ms",
                             "sm90_tflops", "sm90_err", "fa2_tflops", "torch_flash_tflops", "torch_cudnn_tflops",
                             "sm90_vs_fa2", "sm90_vs_torch_flash", "sm90_vs_torch_cudnn"),
    "norm_sweep": ("op", "kind", "impl", "dtype", "tokens", "hidden", "max_abs_err", "ms", "GBps", "frac_copy",
                   "speed_vs_torch", "speed_vs_triton"),
    "softmax_sweep": ("impl", "method", "path", "dtype", "rows", "cols", "max_abs_err", "max_rel_err", "ms", "GBps",
                      "frac_of_copy"),
    "amp_training": ("part", "variant", "log2_scale", "fp16_zero", "fp16_subnormal", "fp16_overflow", "bf16_zero",
                     "final_loss", "test_accuracy", "skipped_steps", "step", "loss"),
    "numerics_softmax_overflow": ("backend", "method", "dtype", "scale", "input_finite", "output_finite",
                                  "max_abs_err"),
    "numerics_reduction_order": ("op", "dataset", "dtype", "tree", "ept", "threads", "blocks_per_row", "kernel",
                                 "err", "bound", "within_bound"),
    "traffic_check": ("kernel", "variant", "shape", "dtype", "modeled_gb", "measured_gb", "ratio", "flag",
                      "predicted_for"),
    "numerics_variance": ("method", "backend", "input_dtype", "arith_dtype", "mean_over_std", "n",
                          "max_rel_err_var"),
}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--plots", default=str(ROOT / "plots"))
    ap.add_argument("--out", default=str(ROOT / "experiments" / "REPORT.md"))
    return ap.parse_args(argv)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3g}"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "x".join(_fmt(x) for x in v)
    s = str(v).replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= 120 else s[:117] + "..."


def md_table(rows, cols) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(out)


def load(results: Path):
    """[(stem, doc)] for every readable results JSON (sorted by name); unreadable files are reported, skipped."""
    docs, bad = [], []
    if not results.is_dir():
        return docs, bad
    for p in sorted(results.glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except Exception as e:
            bad.append((p.name, f"{type(e).__name__}: {e}"))
            continue
        if isinstance(doc, list):
            doc = {"rows": doc}
        if not isinstance(doc, dict):
            bad.append((p.name, "not a JSON object"))
            continue
        docs.append((p.stem, doc))
    return docs, bad


def kind_of(stem: str) -> str:
    """The experiment a results file belongs to: its stem without ``_predicted``, ``_quick`` (a smoke run) and
    ``_model_only`` (amp_training without its GPU part)."""
    for tag in ("_predicted", "_quick", "_model_only"):
        stem = stem.replace(tag, "")
    return stem


def is_predicted(stem, doc) -> bool:
    meta = doc.get("meta") or {}
    rows = doc.get("rows") or []
    return (stem.endswith("_predicted") or bool(meta.get("predicted"))
            or (bool(rows) and all(isinstance(r, dict) and r.get("mode") == "predicted" for r in rows)))


def pick_columns(rows, stem: str = "") -> list[str]:
    present = list(dict.fromkeys(k for r in rows if isinstance(r, dict) for k in r))
    fixed = [c for c in SECTION_COLS.get(kind_of(stem), ()) if c in present]
    if len(fixed) >= 3:
        return fixed + [c for c in ("mode", "model_note", "error") if c in present and c not in fixed]
    cols = [c for c in ID_COLS if c in present][:5]
    cols += [c for c in ("shape", "dtype") if c in present]
    cols += [c for c in ERR_COLS if c in present]
    cols += [c for c in LAT_COLS if c in present][:2]
    cols += [c for c in present if THRU_RE.search(c)][:2]
    cols += [c for c in ("hbm_gb_model", "hbm_gb_measured", "passes_model", "passes_equiv") if c in present]
    cols += [c for c in present if RATIO_RE.search(c) and c not in cols][:3]
    cols += [c for c in ("model_note", "error") if c in present]
    if len(cols) < 3:  # unknown kind of file: its first columns
        cols += [c for c in present if c not in cols][: 10 - len(cols)]
    return list(dict.fromkeys(cols))


def env_line(doc) -> str:
    env = doc.get("environment") or {}
    parts = [f"GPU **{env.get('gpu') or 'none (CPU)'}**", f"commit `{env.get('commit', '?')}`",
             f"date {env.get('date', '?')}"]
    cmd = env.get("command")
    if cmd:
        parts.append(f"command `{cmd}`")
    return " · ".join(parts)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def shape_of(r) -> str:
    """The row's shape: its ``shape`` column, else one made from the size columns it has."""
    if r.get("shape"):
        return str(r["shape"])
    if all(k in r for k in ("batch", "heads", "seqlen", "head_dim")):
        return f"B{r['batch']} H{r['heads']} N{r['seqlen']} d{r['head_dim']}"
    for a, b in (("tokens", "hidden"), ("rows", "cols")):
        if a in r and b in r:
            return f"{r[a]}x{r[b]}"
    return f"n={r['n']}" if "n" in r else ""


def _entry(r, kernel, lat, thr=None, abs_err=None, rel_err=None, ratios=(), shape=None, dtype=None) -> dict:
    """One judged row; ``thr`` = (column name, value); ``ratios`` = [(name, value)] (non-numbers dropped)."""
    return {"kernel": kernel, "shape": shape_of(r) if shape is None else shape,
            "dtype": r.get("dtype", "") if dtype is None else dtype, "max_abs_err": abs_err, "max_rel_err": rel_err,
            "latency_ms": lat, "throughput": f"{_fmt(thr[1])} {thr[0]}" if thr and _num(thr[1]) else "",
            "ratio to peer (same run)": ", ".join(f"{c}={_fmt(v)}" for c, v in ratios if _num(v))}


def _div(a, b):
    return a / b if _num(a) and _num(b) and b else None


def _causal(r) -> str:
    return " causal" if r.get("causal") else ""


def _tile_sweep(rows, doc):
    """attention fa2 Br×Bc/warps, B H N d; ratio: speed against the default tile of the same head_dim/run."""
    tkey = "median_ms" if any("median_ms" in r for r in rows) else "ms"
    dflt = {}
    for r in rows:
        if r.get("default") and _num(r.get(tkey)):
            dflt[(r.get("head_dim"), r.get("causal"), shape_of(r), r.get("dtype"))] = r[tkey]
    out = []
    for r in rows:
        if not _num(r.get(tkey)):
            continue
        name = (f"attention fa2 {r.get('Br')}×{r.get('Bc')}/{r.get('warps')}w"
                f"{' (default)' if r.get('default') else ''}{_causal(r)}")
        ref = dflt.get((r.get("head_dim"), r.get("causal"), shape_of(r), r.get("dtype")))
        rat = [("speed_vs_default_tile", _div(ref, r[tkey]))]
        if _num(r.get("ncu_dram_bytes")):
            rat.append(("ncu_over_model_bytes", _div(r["ncu_dram_bytes"], r.get("model_bytes"))))
        out.append(_entry(r, name, r[tkey], ("tflops", r.get("tflops")), ratios=rat))
    return out


def _attention_bench(rows, doc):
    """One row per shape with cuflash fa2, wgmma and torch peers: one judged row per cuflash kernel."""
    out = []
    for r in rows:
        fa2 = f"attention fa2 {r.get('tiles') or ''}".strip()
        for pre, name in (("cuflash", fa2), ("wgmma", "attention wgmma sm90")):
            if not _num(r.get(f"{pre}_ms")):
                continue
            rp = "" if pre == "cuflash" else pre + "_"
            out.append(_entry(r, name + _causal(r), r[f"{pre}_ms"], ("tflops", r.get(f"{pre}_tflops")),
                              abs_err=r.get(f"{pre}_err"),
                              ratios=[("speed_vs_torch_flash", r.get(f"{rp}ratio_vs_flash")),
                                      ("speed_vs_torch_cudnn", r.get(f"{rp}ratio_vs_cudnn"))]))
    return out


def _attention_bwd_bench(rows, doc):
    out = []
    for r in rows:
        det = " deterministic" if r.get("deterministic") else ""
        if _num(r.get("cuflash_bwd_ms")):
            out.append(_entry(r, f"attention bwd fa2{det}{_causal(r)}", r["cuflash_bwd_ms"],
                              ("tflops", r.get("cuflash_bwd_tflops")), abs_err=r.get("dq_err"),
                              ratios=[("speed_vs_torch_flash", _div(r.get("cuflash_bwd_tflops"),
                                                                    r.get("torch_flash_bwd_tflops"))),
                                      ("speed_vs_torch_cudnn", _div(r.get("cuflash_bwd_tflops"),
                                                                    r.get("torch_cudnn_bwd_tflops")))]))
        if _num(r.get("cuflash_fwdbwd_ms")):
            out.append(_entry(r, f"attention fwd+bwd fa2{det}{_causal(r)}", r["cuflash_fwdbwd_ms"],
                              ("tflops", r.get("cuflash_fwdbwd_tflops")), abs_err=r.get("dq_err"),
                              ratios=[("speed_vs_torch_flash", r.get("ratio_fwdbwd_vs_flash")),
                                      ("speed_vs_torch_cudnn", r.get("ratio_fwdbwd_vs_cudnn"))]))
    return out


def _attention_sm90_bench(rows, doc):
    out = []
    for r in rows:
        if _num(r.get("sm90_ms")):
            out.append(_entry(r, f"attention wgmma sm90 {r.get('sm90_variant') or ''}".rstrip() + _causal(r),
                              r["sm90_ms"], ("tflops", r.get("sm90_tflops")), abs_err=r.get("sm90_err"),
                              ratios=[("speed_vs_torch_flash", r.get("sm90_vs_torch_flash")),
                                      ("speed_vs_torch_cudnn", r.get("sm90_vs_torch_cudnn")),
                                      ("speed_vs_fa2", r.get("sm90_vs_fa2"))]))
        if _num(r.get("fa2_ms")):
            out.append(_entry(r, f"attention fa2{_causal(r)}", r["fa2_ms"], ("tflops", r.get("fa2_tflops")),
                              abs_err=r.get("fa2_err"),
                              ratios=[("speed_vs_torch_flash", _div(r.get("torch_flash_ms"), r["fa2_ms"])),
                                      ("speed_vs_torch_cudnn", _div(r.get("torch_cudnn_ms"), r["fa2_ms"]))]))
    return out


def _norm_sweep(rows, doc):
    ops = {"fwd": "forward", "fwd_res": "forward +residual", "bwd": "backward"}
    out = []
    for r in rows:
        if not _num(r.get("ms")):
            continue
        impl = r.get("impl", "")
        what = "device copy (same bytes)" if impl == "copy" else \
            f"{impl} {r.get('kind', '')}_norm {ops.get(r.get('op'), r.get('op', ''))}"
        out.append(_entry(r, what, r["ms"], ("GBps", r.get("GBps")), abs_err=r.get("max_abs_err"),
                          ratios=[("speed_vs_torch", r.get("speed_vs_torch")),
                                  ("speed_vs_triton", r.get("speed_vs_triton")), ("frac_of_copy", r.get("frac_copy"))]))
    return out


def _softmax_sweep(rows, doc):
    """impl softmax method (path); ratio: fraction of the same run's copy bandwidth and speed vs torch.softmax
    (log_softmax rows: vs torch.log_softmax)."""
    torch_ms = {("log" in r["impl"], r.get("dtype"), r.get("rows"), r.get("cols")): r["ms"] for r in rows
                if r.get("impl") in ("torch.softmax", "torch.log_softmax") and _num(r.get("ms"))}
    out = []
    for r in rows:
        if not _num(r.get("ms")):
            continue
        impl = r.get("impl", "")
        what = impl if "softmax" in impl else f"{impl} softmax"
        if r.get("method"):
            what += f" {r['method']}"
        if r.get("path"):
            what += f" ({r['path']})"
        rat = [("frac_of_copy", r.get("frac_of_copy"))]
        if not impl.startswith("torch."):
            key = ("log" in impl, r.get("dtype"), r.get("rows"), r.get("cols"))
            rat.append(("speed_vs_torch", _div(torch_ms.get(key), r["ms"])))
        out.append(_entry(r, what, r["ms"], ("GBps", r.get("GBps")), abs_err=r.get("max_abs_err"),
                          rel_err=r.get("max_rel_err"), ratios=rat))
    return out


def _roofline_shapes(doc) -> dict:
    """kernel name -> shape, read from experiments/roofline.py's kernel list (empty when it cannot be read)."""
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_cuflash_report_roofline", Path(__file__).parent / "roofline.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        quick = bool(((doc.get("meta") or {}).get("args") or {}).get("quick"))
        shapes = {}
        for k in mod.kernels(quick):
            m = re.search(r"\(\((\d+(?:, \d+)*)\)", k[5])
            dims = [int(x) for x in m.group(1).split(", ")] if m else []
            shapes[k[0]] = (f"B{dims[0]} H{dims[1]} N{dims[2]} d{dims[3]}" if len(dims) == 4 else
                            "x".join(map(str, dims)))
        return shapes
    except Exception:
        return {}


def _roofline(rows, doc):
    shapes = _roofline_shapes(doc)
    out = []
    for r in rows:
        if _num(r.get("ms")):
            out.append(_entry(r, r.get("kernel", ""), r["ms"], ("TFLOPs", r.get("TFLOPs")),
                              ratios=[("fraction_of_roof", r.get("fraction_of_roof"))],
                              shape=shapes.get(r.get("kernel"), "")))
    return out


LABELERS = {"attention_tile_sweep": _tile_sweep, "attention_bench": _attention_bench,
            "attention_bwd_bench": _attention_bwd_bench, "attention_sm90_bench": _attention_sm90_bench,
            "norm_sweep": _norm_sweep, "softmax_sweep": _softmax_sweep, "roofline": _roofline}


def _generic(stem, rows):
    """Rows with a latency and errors or a throughput, labelled from their identifying columns."""
    out = []
    for r in rows:
        lat = next((c for c in LAT_COLS if _num(r.get(c))), None)
        thr = next(((c, r[c]) for c in r if THRU_RE.search(c) and _num(r[c])), None)
        if lat is None or not (any(c in r for c in ERR_COLS) or thr):
            continue
        words = []
        for c in ID_COLS[:8]:
            w = _fmt(r.get(c))
            if w and w not in " ".join(words).split():
                words.append(w)
        if "Br" in r and "Bc" in r:
            words.append(f"{r['Br']}×{r['Bc']}")
        ident = " ".join(words) or stem.replace("_predicted", "").replace("_", " ")
        rat = [(c, r[c]) for c in r if RATIO_RE.search(c) and _num(r[c]) and c != "measured_over_modeled"]
        out.append(_entry(r, ident, r[lat] / 1000.0 if lat == "us" else r[lat], thr, r.get("max_abs_err"),
                          r.get("max_rel_err"), rat[:3]))
    return out


def judged_rows(docs, per_source=None):
    """One row per kernel measurement with a latency and errors or a throughput (the table every kernel is judged
    by), measured files first. With ``per_source``, at most that many rows per file (rows with a peer ratio
    first); returns (rows, {source: rows left out})."""
    out, left = [], {}
    for stem, doc in sorted(docs, key=lambda sd: is_predicted(*sd)):
        pred = is_predicted(stem, doc)
        rows = [r for r in (doc.get("rows") or []) if isinstance(r, dict)]
        fn = LABELERS.get(kind_of(stem))
        try:
            got = fn(rows, doc) if fn else _generic(stem, rows)
        except Exception:  # an unexpected layout: the generic labels
            got = _generic(stem, rows)
        src = stem + (" (PREDICTED)" if pred else "")
        if per_source and len(got) > per_source:
            keep = set(map(id, [g for g in got if g["ratio to peer (same run)"]][:per_source]))
            keep |= set(map(id, [g for g in got if id(g) not in keep][:per_source - len(keep)]))
            left[src] = len(got) - per_source
            got = [g for g in got if id(g) in keep]
        out += [{"source": src, **g} for g in got]
    return (out, left) if per_source else out


def plots_for(stem, plots: Path):
    if not plots.is_dir():
        return []
    pred, quick = "predicted" in stem, "_quick" in stem
    return [p for p in sorted(plots.glob("*.png"))
            if p.stem == stem or (p.stem.startswith(stem + "_") and ("predicted" in p.stem) == pred
                                  and ("_quick" in p.stem) == quick)]


TRAFFIC = "traffic_check"


def traffic_section(data, plots: Path, out: Path):
    """(lines, stem used) of the "Modeled vs measured HBM bytes" table: kernel, shape, modeled GB, measured GB,
    their ratio and the note, from traffic_check.json (measured), else traffic_check_predicted.json; ([], None)
    when neither exists."""
    docs = dict(data)
    stem = next((s for s in (TRAFFIC, TRAFFIC + "_predicted") if s in docs), None)
    if stem is None:
        return [], None
    doc = docs[stem]
    pred = is_predicted(stem, doc)
    rows = []
    for r in (x for x in (doc.get("rows") or []) if isinstance(x, dict)):
        kern = f"{r.get('kernel', '')} {r.get('variant') or ''}".strip()
        note = r.get("model_note") or r.get("error") or ""
        mb = r.get("model_bytes")
        rows.append({"kernel": kern, "shape": r.get("shape", ""), "dtype": r.get("dtype", ""),
                     "modeled GB": r.get("modeled_gb", mb / 1e9 if _num(mb) else None),
                     "measured GB": r.get("measured_gb"), "measured / modeled": r.get("ratio"),
                     "note": ("> 10 %: " + note) if r.get("flag") else note})
    lines = [f"## Modeled vs measured HBM bytes{' — PREDICTED (no GPU)' if pred else ''}", "",
             f"`{stem}.json` · " + env_line(doc), "",
             "Modeled: `cuflash.traffic` (the bytes the schedule moves, no credit for L2). Measured: Nsight Compute "
             "`dram__bytes_read.sum + dram__bytes_write.sum` over every launch of the call (caches flushed before "
             "each kernel). Notes flag differences above 10 % and give the known reason.", ""]
    if pred:
        lines += ["_PREDICTED: no measurement was made (no GPU or no ncu); the measured columns are empty._", ""]
    lines += [md_table(rows, ["kernel", "shape", "dtype", "modeled GB", "measured GB", "measured / modeled",
                              "note"]) if rows else "_No rows._", ""]
    for p in plots_for(stem, plots):
        lines += [f"![{p.stem}]({os.path.relpath(p, out.parent)})", ""]
    return lines, stem


def build(results: Path, plots: Path, out: Path) -> str:
    docs, bad = load(results)
    tests = [(s, d) for s, d in docs if s.endswith("_tests") or ("counts" in d and "rows" not in d)]
    data = [(s, d) for s, d in docs if (s, d) not in tests]
    order = list(TITLES)
    data.sort(key=lambda sd: (order.index(kind_of(sd[0])) if kind_of(sd[0]) in order else len(order),
                              sd[0].endswith("_predicted"), sd[0]))
    lines = ["# cuflash results report", "",
             f"Generated by `experiments/report.py` from `{os.path.relpath(results, out.parent)}` "
             f"({len(data)} results files, {len(tests)} test records). Sections marked **PREDICTED** were made "
             "without a GPU: traffic model + roofline times from `cuflash/gpus.py`, not measurements.", ""]
    judged, left = judged_rows(data, PER_SOURCE)
    lines += ["## The table every kernel is judged by", ""]
    if judged:
        cols = ["source", "kernel", "shape", "dtype", "max_abs_err", "max_rel_err", "latency_ms", "throughput",
                "ratio to peer (same run)"]
        lines += ["Measured files first, PREDICTED (model, no GPU) after. Ratios are speed ratios against a peer "
                  "measured in the same run (> 1: faster than the peer; `frac_of_copy`: fraction of the device-copy "
                  "bandwidth; `time_vs_*`: time ratio, < 1 is faster).", ""]
        lines += [md_table(judged, cols), ""]
        if left:
            lines += ["_More rows in the sections below: " + ", ".join(f"{n} of {s}" for s, n in left.items())
                      + "._", ""]
    else:
        lines += ["_No results with latencies yet (run the experiments)._", ""]
    tlines, tstem = traffic_section(data, plots, out)
    lines += tlines
    for stem, doc in data:
        if stem == tstem:
            continue
        rows = [r for r in (doc.get("rows") or []) if isinstance(r, dict)]
        pred = is_predicted(stem, doc)
        base = kind_of(stem)
        title = TITLES.get(base, base.replace("_", " ")) + (" — quick smoke run" if "_quick" in stem else "")
        lines += [f"## {title}{' — PREDICTED (no GPU)' if pred else ''}", "", f"`{stem}.json` · " + env_line(doc),
                  ""]
        meta = doc.get("meta") or {}
        note = meta.get("note")
        if note:
            lines += [f"> {_fmt(note)}", ""]
        if rows:
            cols = pick_columns(rows, stem)
            lines += [md_table(rows[:MAX_ROWS], cols), ""]
            if len(rows) > MAX_ROWS:
                lines += [f"_{len(rows) - MAX_ROWS} more rows in `{stem}.json`._", ""]
            flagged = [r for r in rows if r.get("model_note")]
            if flagged:
                lines += [f"Measured DRAM bytes differ from the model by more than 10% in {len(flagged)} row(s) "
                          "(see `model_note`; L2 hits on re-reads are the usual cause).", ""]
        else:
            lines += ["_No rows._", ""]
        for p in plots_for(stem, plots):
            lines += [f"![{p.stem}]({os.path.relpath(p, out.parent)})", ""]
    if tests:
        lines += ["## GPU test records", ""]
        trs = []
        for stem, d in tests:
            env = d.get("environment") or {}
            c = d.get("counts") or {}
            trs.append({"record": stem, "gpu": env.get("gpu"), "commit": env.get("commit"), "passed": c.get("passed"),
                        "failed": c.get("failed"), "skipped": c.get("skipped"),
                        "first failures": ", ".join((d.get("failed") or [])[:3])})
        lines += [md_table(trs, ["record", "gpu", "commit", "passed", "failed", "skipped", "first failures"]), ""]
    if bad:
        lines += ["## Unreadable results files", ""] + [f"- `{n}`: {e}" for n, e in bad] + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(a.out)
    if not Path(a.results).is_dir():
        print(f"report: no results folder {a.results} (--results names the folder of the *.json results); "
              f"nothing written", file=sys.stderr)
        return 2
    text = build(Path(a.results), Path(a.plots), out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
