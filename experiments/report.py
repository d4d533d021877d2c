"""Turn the committed results (``experiments/results/*.json``) into one Markdown report (``experiments/REPORT.md``).

The report opens with the table every kernel is judged by — kernel, shape, dtype, max abs err, max rel err,
latency, GB/s or TFLOP/s, and the ratio to the peer/anchor measured in the same run — gathered from every
results file that has those columns, then one section per results file (environment: GPU, commit, command,
date; a table of its rows; its plots from ``plots/``), then the GPU test records (``*_tests.json``).
It reads whatever exists and skips what is missing or unreadable; files made without a GPU (``*_predicted``,
or ``meta.predicted``) are labelled PREDICTED everywhere they appear.

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
RATIO_RE = re.compile(r"(vs_|_vs|speed|ratio|over_|fraction|speedup)", re.I)
ERR_COLS = ("max_abs_err", "max_rel_err")
TITLES = {"attention_tile_sweep": "Attention tile sweep", "fig2": "FlashAttention Fig. 2 on this GPU",
          "softmax_passes": "Softmax methods: passes vs time", "norm_fusion": "Fused residual + norm",
          "roofline": "Roofline"}
MAX_ROWS = 80


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


def is_predicted(stem, doc) -> bool:
    meta = doc.get("meta") or {}
    rows = doc.get("rows") or []
    return (stem.endswith("_predicted") or bool(meta.get("predicted"))
            or (bool(rows) and all(isinstance(r, dict) and r.get("mode") == "predicted" for r in rows)))


def pick_columns(rows) -> list[str]:
    present = list(dict.fromkeys(k for r in rows if isinstance(r, dict) for k in r))
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


def judged_rows(docs):
    """One row per kernel measurement with a latency and errors or a throughput (the table every kernel is judged by)."""
    out = []
    for stem, doc in docs:
        pred = is_predicted(stem, doc)
        for r in doc.get("rows") or []:
            if not isinstance(r, dict):
                continue
            lat = next((c for c in LAT_COLS if isinstance(r.get(c), (int, float))), None)
            thr = next(((c, r[c]) for c in r if THRU_RE.search(c) and isinstance(r[c], (int, float))), None)
            if lat is None or not (any(c in r for c in ERR_COLS) or thr):
                continue
            words = []
            for c in ID_COLS[:8]:
                w = _fmt(r.get(c))
                if w and w not in " ".join(words).split():
                    words.append(w)
            ident = " ".join(words)
            rat = [(c, r[c]) for c in r if RATIO_RE.search(c) and isinstance(r[c], (int, float))
                   and c != "measured_over_modeled"]
            out.append({"source": stem + (" (PREDICTED)" if pred else ""), "kernel": ident,
                        "shape": r.get("shape", ""), "dtype": r.get("dtype", ""),
                        "max_abs_err": r.get("max_abs_err"), "max_rel_err": r.get("max_rel_err"),
                        "latency_ms": r[lat] / 1000.0 if lat == "us" else r[lat],
                        "throughput": f"{_fmt(thr[1])} {thr[0]}" if thr else "",
                        "ratio to peer (same run)": ", ".join(f"{c}={_fmt(v)}" for c, v in rat[:2])})
    return out


def plots_for(stem, plots: Path):
    if not plots.is_dir():
        return []
    pred = "predicted" in stem
    return [p for p in sorted(plots.glob("*.png"))
            if p.stem == stem or (p.stem.startswith(stem + "_") and ("predicted" in p.stem) == pred)]


def build(results: Path, plots: Path, out: Path) -> str:
    docs, bad = load(results)
    tests = [(s, d) for s, d in docs if s.endswith("_tests") or ("counts" in d and "rows" not in d)]
    data = [(s, d) for s, d in docs if (s, d) not in tests]
    order = list(TITLES)
    data.sort(key=lambda sd: (order.index(sd[0].replace("_predicted", "")) if sd[0].replace("_predicted", "")
                              in order else len(order), sd[0].endswith("_predicted"), sd[0]))
    lines = ["# cuflash results report", "",
             f"Generated by `experiments/report.py` from `{os.path.relpath(results, out.parent)}` "
             f"({len(data)} results files, {len(tests)} test records). Sections marked **PREDICTED** were made "
             "without a GPU: traffic model + roofline times from `cuflash/gpus.py`, not measurements.", ""]
    judged = judged_rows(data)
    lines += ["## The table every kernel is judged by", ""]
    if judged:
        cols = ["source", "kernel", "shape", "dtype", "max_abs_err", "max_rel_err", "latency_ms", "throughput",
                "ratio to peer (same run)"]
        lines += [md_table(judged[:3 * MAX_ROWS], cols), ""]
        if len(judged) > 3 * MAX_ROWS:
            lines += [f"_{len(judged) - 3 * MAX_ROWS} more rows in the sections below._", ""]
    else:
        lines += ["_No results with latencies yet (run the experiments)._", ""]
    for stem, doc in data:
        rows = [r for r in (doc.get("rows") or []) if isinstance(r, dict)]
        pred = is_predicted(stem, doc)
        base = stem.replace("_predicted", "")
        title = TITLES.get(base, base.replace("_", " "))
        lines += [f"## {title}{' — PREDICTED (no GPU)' if pred else ''}", "", f"`{stem}.json` · " + env_line(doc), ""]
        meta = doc.get("meta") or {}
        note = meta.get("note")
        if note:
            lines += [f"> {_fmt(note)}", ""]
        if rows:
            cols = pick_columns(rows)
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
    text = build(Path(a.results), Path(a.plots), out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
