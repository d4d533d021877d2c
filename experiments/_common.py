"""Helpers shared by the experiment scripts (moved here from the scripts, unchanged but for the parameters named).

Attention benchmarks (attention_bench.py, attention_bwd_bench.py, attention_sm90_bench.py):
    ``add_shape_args``  the --seqlens / --head-dims / --dtypes / --masks arguments (seqlens default per script)
    ``sdpa_peers``      the torch SDPA peer loader (torch, SDPBackend, sdpa_kernel) or None, printing why
    ``half_to_torch``   zero-copy torch view of a float16 / bfloat16 CuPy array (``unsigned``: bf16 through
                        uint16, as attention_bwd_bench does, else int16)
    ``sample_ref``      float64 reference output on sampled query rows of batch 0
Predicted / measured experiments (fig2.py, roofline.py, norm_fusion.py, softmax_passes.py, tile_sweep.py):
    ``output_dirs``     point bench.write_results at --out and return the plot folder
    ``predicted_mode``  --predict or no CUDA device (the no-GPU line printed then)
    ``scratch_out``     no GPU and no --predict: the PREDICTED files go to --out or a temporary folder
    ``print_results``   the result table (columns present in the rows) and the "wrote" line
    ``to_torch`` / ``from_torch``  CuPy <-> torch views of any dtype (bfloat16 through int16)
Plots (all of the above): ``pyplot`` (matplotlib on Agg), ``predicted_watermark``, ``save_figure``.
Re-plotting from committed results (no GPU, no measurement): ``add_replot_arg`` (the --replot flag) and
``load_results`` (experiments/results/<name>.json, or another results folder).
Arguments: ``positive_int`` / ``nonnegative_int`` / ``positive_float`` / ``int_list`` / ``name_list`` (argparse
types that reject nonsense with a usage error), ``fill_defaults`` (--quick changes only the defaults of the flags
not given: declare them with ``default=None``), ``run_names`` (a --quick run's results and plot get their own
names, so a smoke run never replaces the committed full run).

The scripts run as ``python3 experiments/X.py`` and are loaded from their file by cuflash/cli.py and the
tests, so each puts this folder on sys.path before ``from _common import ...``.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np


# ------------------------------------------------------------------------------------------ arguments
def _number(text, kind, least, what):
    import argparse

    try:
        v = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v >= least:  # also rejects nan
        raise argparse.ArgumentTypeError(f"{text!r}: must be {what}")
    return v


def positive_int(text):
    """argparse type: an integer >= 1 (``--rep 0`` and ``--mib -1`` are usage errors)."""
    return _number(text, int, 1, "a positive integer")


def nonnegative_int(text):
    """argparse type: an integer >= 0 (``--warmup 0`` is fine)."""
    return _number(text, int, 0, "an integer >= 0")


def positive_float(text):
    """argparse type: a number > 0."""
    import argparse

    v = _number(text, float, 0.0, "a positive number")
    if v == 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number")
    return v


def int_list(text):
    """argparse type: comma-separated positive integers, kept as the string the scripts split (``"1024,4096"``)."""
    import argparse

    for x in text.split(","):
        try:
            positive_int(x)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated positive integers") from None
    return text


def name_list(choices):
    """argparse type: comma-separated names, each one of ``choices`` (``"float32,bfloat16"``); kept as the string."""
    import argparse

    def check(text):
        bad = [x for x in text.split(",") if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))} not among {', '.join(choices)}")
        return text

    return check


def _shown(v):
    return " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def default_help(text, key, full, quick=None):
    """``text`` and the default of ``key``: "(default X; Y with --quick)"."""
    q = f"; {_shown(quick[key])} with --quick" if quick and key in quick else ""
    return f"{text} (default {_shown(full[key])}{q})"


def fill_defaults(a, full, quick=None):
    """--quick changes the defaults only: each key of ``full`` that the command line left at None (declare those
    arguments with ``default=None``) takes the value from ``quick`` (with ``a.quick``, where it has the key) or
    from ``full``; what the user gave is kept. Returns ``a``."""
    table = {**full, **(quick or {})} if getattr(a, "quick", False) else full
    for k, v in table.items():
        if getattr(a, k, None) is None:
            setattr(a, k, list(v) if isinstance(v, list) else v)
    return a


def run_names(a, name, plot, *tags):
    """Fill ``a.name`` when --name was not given (declare it with ``default=None``) and return the plot's file
    stem. A full run is ``name``; a --quick run ``<name>_quick`` (plus ``_<tag>`` for each non-empty ``tags``,
    e.g. amp_training's ``model_only``), so a smoke run never replaces the committed results. The plot is
    ``plot`` for the results name ``name`` and the results name otherwise (plots/softmax_sweep_quick.png), so
    neither does its figure."""
    if a.name is None:
        a.name = "_".join([name] + (["quick"] if getattr(a, "quick", False) else []) + [t for t in tags if t])
    return plot if a.name == name else a.name


# ------------------------------------------------------------------------------------------ attention benchmarks
ATTENTION_DTYPES = ("bfloat16", "float16")


def add_shape_args(ap, seqlens):
    """The shape arguments of the attention benchmarks (FlashAttention-2 convention sweeps)."""
    ap.add_argument("--seqlens", type=positive_int, nargs="+", default=seqlens)
    ap.add_argument("--head-dims", type=positive_int, nargs="+", default=[64, 128])
    ap.add_argument("--dtypes", nargs="+", default=list(ATTENTION_DTYPES), choices=ATTENTION_DTYPES)
    ap.add_argument("--masks", nargs="+", default=["full", "causal"], choices=["full", "causal"])


def sdpa_peers(prog):
    """(torch, SDPBackend, sdpa_kernel) when torch sees a CUDA device, else None (``prog`` names the script)."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if not torch.cuda.is_available():
            return None
        return torch, SDPBackend, sdpa_kernel
    except Exception as e:  # pragma: no cover - depends on the machine
        print(f"{prog}: torch peers skipped ({e})")
        return None


def half_to_torch(torch, x, unsigned=False):
    """Zero-copy torch view of a CuPy array (bf16 through a 16-bit integer view: DLPack support varies)."""
    import cupy as cp

    if x.dtype == np.float16:
        return torch.from_dlpack(x)
    return torch.from_dlpack(x.view(cp.uint16 if unsigned else cp.int16)).view(torch.bfloat16)


def sample_ref(q, k, v, causal, rows):
    """float64 reference output for query ``rows`` of batch 0, all heads: (H, len(rows), d)."""
    import cupy as cp

    qs = q[0][:, rows].astype(cp.float64)
    kk, vv = k[0].astype(cp.float64), v[0].astype(cp.float64)
    d = q.shape[-1]
    s = cp.matmul(qs, kk.swapaxes(-1, -2)) / math.sqrt(d)
    if causal:
        j = cp.arange(k.shape[2])[None, :]
        i = cp.asarray(rows)[:, None] + (k.shape[2] - q.shape[2])
        s = cp.where(j <= i, s, -cp.inf)
    s = s - s.max(-1, keepdims=True)
    p = cp.exp(s)
    return cp.matmul(p, vv) / p.sum(-1, keepdims=True)


# ------------------------------------------------------------------------------------------ predicted / measured
def output_dirs(a):
    """Point bench.write_results at --out (tests use a tmp dir) and return the plot folder."""
    from cuflash import bench

    if a.out:
        bench.RESULTS = Path(a.out)
    plots = Path(a.plots) if a.plots else (Path(a.out) / "plots" if a.out else bench.PLOTS)
    plots.mkdir(parents=True, exist_ok=True)
    return plots


def predicted_mode(a, message):
    """True for the model-only run: --predict, or no CUDA device (then ``message`` is printed)."""
    from cuflash import bench

    predicted = a.predict or not bench.has_gpu()
    if predicted and not a.predict:
        print(message)
    return predicted


def scratch_out(a, prog):
    """The model-only run that no GPU forced (not --predict): unless --out names a folder, its PREDICTED files go
    to a new temporary folder (said on stdout), never over the committed experiments/results. Returns a.out."""
    import tempfile

    if a.out is None:
        a.out = tempfile.mkdtemp(prefix=f"cuflash_{prog}_")
        print(f"{prog}: the PREDICTED files go to {a.out} (--predict writes them to experiments/results, "
              f"--out DIR to DIR)")
    return a.out


def print_results(path, rows, cols):
    """The table of ``rows`` (those of ``cols`` present in some row) and the line naming the results file."""
    from cuflash import bench

    cols = [c for c in cols if any(c in r for r in rows)]
    print(bench.table(rows, cols))
    print(f"wrote {path}")


def to_torch(torch, x):
    """A torch view of a CuPy array (bfloat16 through an int16 view: DLPack has no ml_dtypes bfloat16)."""
    import cupy as cp

    if str(x.dtype) == "bfloat16":
        return torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def from_torch(torch, t):
    import cupy as cp

    from cuflash import _dtypes

    if t.dtype == torch.bfloat16:
        return cp.from_dlpack(t.contiguous().view(torch.int16)).view(cp.uint16).view(_dtypes.bfloat16)
    return cp.from_dlpack(t.contiguous())


# ------------------------------------------------------------------------------------------ plots
def pyplot():
    """matplotlib.pyplot on the Agg backend (no display where the experiments run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def predicted_watermark(fig, label):
    """The red PREDICTED stamp across a figure whose ``label`` says PREDICTED."""
    if "PREDICTED" in label:
        fig.text(0.5, 0.5, "PREDICTED (model, no GPU)", color="red", alpha=0.18, fontsize=40, ha="center",
                 va="center", rotation=15)


def save_figure(fig, path, dpi=120, mkdir=True, rect=None):
    """Lay out (inside ``rect``, figure fraction, when given), save (creating the folder when ``mkdir``) and
    close ``fig``."""
    import matplotlib.pyplot as plt

    fig.tight_layout() if rect is None else fig.tight_layout(rect=rect)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot_tflops_grid(rows, series, path, ylabel, title):
    """TFLOP/s against seqlen, one panel per (causal, head_dim), bfloat16 solid and float16 dashed.

    ``series``: (row key, colour, label) per line; a row without the key (or with None) is left out.
    """
    plt = pyplot()

    dims = sorted({r["head_dim"] for r in rows})
    masks = sorted({r["causal"] for r in rows})
    fig, axes = plt.subplots(len(masks), len(dims), figsize=(5.5 * len(dims), 4 * len(masks)), squeeze=False)
    for i, causal in enumerate(masks):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            for dn, ls in (("bfloat16", "-"), ("float16", "--")):
                rs = sorted([r for r in rows if r["head_dim"] == d and r["causal"] == causal and r["dtype"] == dn],
                            key=lambda r: r["seqlen"])
                for key, c, lab in series:
                    pts = [(r["seqlen"], r[key]) for r in rs if r.get(key)]
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], ls, color=c, marker="o", ms=3,
                                label=f"{lab} {dn}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("seqlen")
            ax.set_ylabel(ylabel)
            ax.set_title(f"head_dim {d}, {'causal' if causal else 'no mask'}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------ replot
COMMITTED = Path(__file__).resolve().parent / "results"   # the checkout's experiments/results


def add_replot_arg(ap, name, out=False):
    """The --replot flag: redraw the figure from ``experiments/results/<name>.json`` only (no GPU, exit 0);
    ``out``: the script has --out (a results folder, read first when it holds the file; the plot goes there)."""
    where = " or from --out's folder when it holds that file; the PNG goes to --plots or OUT/plots" if out else ""
    ap.add_argument("--replot", action="store_true",
                    help=f"only redraw the plot from experiments/results/{name}.json (its rows{where}); no GPU, "
                         f"no measurement, nothing written but the PNG")


def load_results(name, folder=None):
    """The results document (``environment``, ``meta``, ``rows``) of ``<folder>/<name>.json`` (default folder:
    cuflash.bench.RESULTS, i.e. experiments/results) or, when that folder has no such file, of the committed
    ``experiments/results/<name>.json`` (``--replot --out DIR`` redraws the committed results into DIR).
    ``meta`` is always a dict. Neither file: SystemExit with a message naming both (exit status 1)."""
    import json

    from cuflash import bench

    tried = list(dict.fromkeys(Path(f) / f"{name}.json" for f in (folder or bench.RESULTS, COMMITTED)))
    path = next((p for p in tried if p.is_file()), None)
    if path is None:
        raise SystemExit(f"replot: no results file {' or '.join(map(str, tried))}: run the experiment first (its "
                         f"--name / --quick choose the file)")
    doc = json.loads(path.read_text())
    if not isinstance(doc.get("meta"), dict):
        doc["meta"] = {}
    doc.setdefault("rows", [])
    print(f"replot: {len(doc['rows'])} rows from {path}")
    return doc


def replot_recorded(a, plots, name, plot, predicted_how, measured_how="measured"):
    """Redraw ``plots/<name>.png`` (``<name>_predicted.png`` with ``--predict``) from the recorded results JSON
    with ``plot(rows, path, label)``; the label names the GPU and ``measured_how``, or says PREDICTED for the GPU
    table the model used (``predicted_how``: what the times are). No GPU use. Returns the exit code."""
    stem = f"{name}_predicted" if a.predict else name
    doc = load_results(stem, a.out)
    rows, meta = doc["rows"], doc["meta"]
    if not rows:
        print(f"{name}: no rows in {stem}.json")
        return 1
    if meta.get("predicted") or a.predict:
        g = meta.get("gpu_table") or next((r.get("predicted_for") for r in rows if r.get("predicted_for")), a.gpu)
        label = f"PREDICTED for {g} ({predicted_how}, no GPU)"
    else:
        label = f"{doc.get('environment', {}).get('gpu') or 'GPU'} ({measured_how})"
    path = Path(plots) / f"{stem}.png"
    plot(rows, path, label)
    print(f"wrote {path}")
    return 0
