"""Softmax methods: passes over memory against time, per row length and dtype.

The schedules (Milakov & Gimelshein 2018; ``cuflash.traffic.softmax_passes``): ``naive`` (sum of exp, then
normalise: 3 accesses per element), ``safe`` (max, sum, normalise: 4), ``online two-pass`` (state pass then
normalise: 3), ``online`` as ``cuflash.softmax`` runs it by default (row held on chip: 2; very long rows with few
rows are split over blocks merging states through a workspace: 2 + workspace; rows too long to hold: 3).
Each row is timed with CUDA events (median, inputs ~L2-sized or larger rotated / flushed) and converted to
*equivalent passes* = time x copy bandwidth / (elements x itemsize), the copy bandwidth measured in the same run:
a schedule that is purely memory bound sits on its modeled pass count. torch.softmax is timed beside it.
Without a GPU (or with ``--predict``): the model only, with roofline-predicted times (labelled PREDICTED), in
softmax_passes_predicted.json|csv and plots/softmax_passes_predicted.png: with ``--predict`` in experiments/results
(or ``--out``), without a GPU and without ``--predict`` in ``--out`` or a new temporary folder it names (never over
the committed files). Exit status 0 either way. ``--quick`` changes the defaults of --elements, --cols and --dtypes
only (what is given is kept).

Measured DRAM bytes (``--ncu``; auto: on for a full run when Nsight Compute is found): the timing loop runs first
and the results are written at once (so a run killed during profiling still leaves the timings); then every
cuflash row is profiled in ONE ncu process (``cuflash.ncu.measure_many``: one Python start-up and JIT warm-up,
marker kernels between the calls; ``--ncu-per-dtype``: one process per dtype, results written after each),
bounded by ``--ncu-timeout`` seconds per process, and the bytes are merged into the rows (``measured_bytes``,
``measured_over_modeled``, ``passes_measured``, ``model_note``; ``ncu_error`` where a call was not measured)
before the results are written again.

    python experiments/softmax_passes.py [--quick] [--predict] [--ncu auto|on|off] [--ncu-timeout S]
                                         [--ncu-per-dtype] [--out DIR] [--plots DIR]
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    default_help, fill_defaults, int_list, name_list, nonnegative_int, output_dirs, positive_float, positive_int,
    predicted_mode, predicted_watermark, print_results, pyplot, save_figure, scratch_out, to_torch)

import numpy as np  # noqa: E402

from cuflash import bench, gpus, ncu, traffic  # noqa: E402

# (label, public method, partition knob or None, model method or None = from the plan)
METHODS = [("naive", "naive", None, "naive"),
           ("safe (3 reads)", "safe", None, "safe"),
           ("online two-pass", "online", {"single_read": False}, "online"),
           ("online (cuflash default)", "online", None, None)]


DTYPES = ("float32", "bfloat16", "float16", "float64")
FULL = {"elements": 1 << 26, "cols": "1024,4096,16384,65536,262144,1048576", "dtypes": "float32,bfloat16,float16"}
QUICK = {"elements": 1 << 22, "cols": "1024,16384,262144", "dtypes": "float32,bfloat16"}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=positive_int,
                    help=default_help("elements per input (rows x cols)", "elements", FULL, QUICK))
    ap.add_argument("--cols", type=int_list, help=default_help("row lengths", "cols", FULL, QUICK))
    ap.add_argument("--dtypes", type=name_list(DTYPES),
                    help=default_help(f"comma-separated, of {', '.join(DTYPES)}", "dtypes", FULL, QUICK))
    ap.add_argument("--rep", type=positive_int, default=20)
    ap.add_argument("--warmup", type=nonnegative_int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --elements, --cols and --dtypes (not what is given)")
    ap.add_argument("--predict", action="store_true")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--ncu", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--ncu-timeout", type=positive_float, default=180.0,
                    help="seconds per ncu process before it is killed (the timings are kept)")
    ap.add_argument("--ncu-per-dtype", action="store_true",
                    help="one ncu process per dtype (results written after each) instead of one for all")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plots", default=None)
    return fill_defaults(ap.parse_args(argv), FULL, QUICK)


def _sm():
    return importlib.import_module("cuflash.softmax")


def model_method(method, partition, model, dtype, rows, cols, x=None, gpu=None):
    """The traffic-model name and split count for one row of the sweep (the plan decides for the default:
    the plan of the real call on ``x`` when given, else the arithmetic plan for ``gpu``'s SM count and compute
    capability, a :class:`cuflash.gpus.GPU`)."""
    if model is not None:
        return model, 1
    try:
        sm = _sm()
        if x is not None:
            pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, method, partition, return_plan=True)[1]
        else:
            kw = {} if gpu is None else {"sms": gpu.sms, "cc": gpu.cc}
            pl = sm.plan(np.dtype(dtype), rows, cols, method=method, partition=partition, **kw)
        if pl.path == "split":
            return "split", pl.chunks
        return ("online" if pl.path == "stream" else "cached"), pl.chunks
    except Exception:
        return "cached", 1


def _dt(name):
    from cuflash import _dtypes

    return getattr(_dtypes, name)


def shapes(a):
    out = []
    for c in [int(x) for x in a.cols.split(",")]:
        rows = max(a.elements // c, 1)
        out.append((rows, c))
    return out


def _call_source(method, part, x):
    """The Python source of one softmax call on the input named ``x`` (as the timing loop calls it)."""
    if part is None:
        return f"sm.softmax({x}, axis=-1, method={method!r})"
    return f"sm._softmax_impl({x}, -1, sm.OP_SOFTMAX, {method!r}, {part!r})"


def ncu_plan(rows):
    """What to profile for ``rows`` (the measured rows of the timing loop): ``(setup, calls, targets)``.

    Every cuflash row that was timed without error (not torch.softmax) gets one call; the inputs, one per
    (dtype, rows, cols), are allocated once in ``setup`` as ``X[i]`` and shared by the methods of that shape.
    ``targets[j]`` is the index in ``rows`` of the row that call ``j`` measures."""
    spec = {m[0]: m for m in METHODS}
    inputs: dict[tuple, int] = {}
    calls, targets = [], []
    for i, r in enumerate(rows):
        if r.get("mode") != "measured" or r["method"] not in spec or r.get("error") or not r.get("ms"):
            continue
        _, method, part, _ = spec[r["method"]]
        key = (r["dtype"], int(r["rows"]), int(r["cols"]))
        j = inputs.setdefault(key, len(inputs))
        calls.append(_call_source(method, part, f"X[{j}]"))
        targets.append(i)
    lines = ["import importlib",
             "from cuflash import _dtypes",
             "from cuflash._attention_alt import from_float32",
             "sm = importlib.import_module('cuflash.softmax')",
             "_rs = cupy.random.RandomState(1)",
             "X = {}"]
    for (dn, nrows, cols), j in inputs.items():
        lines.append(f"X[{j}] = from_float32(_rs.standard_normal(({nrows}, {cols}), dtype=cupy.float32), "
                     f"_dtypes.{dn})")
    lines.append("cupy.cuda.Device().synchronize()")
    return "\n".join(lines) + "\n", calls, targets


def merge_measured(row, m, err=None):
    """Put one measure_many result ``m`` (or None, with ``err``) into ``row``: the fields of ncu.compare plus
    ``passes_measured`` (measured bytes / (elements x itemsize)), ``ncu_error`` when not measured."""
    got = m["bytes"] if m and m.get("error") is None else None
    row.update(ncu.compare(got, row["bytes_model"]))
    if got is not None:
        s = np.dtype(_dt(row["dtype"])).itemsize
        row["passes_measured"] = got / (int(row["rows"]) * int(row["cols"]) * s)
        row["ncu_launches"] = m.get("n_launches")
        row.pop("ncu_error", None)
    else:
        row["ncu_error"] = str((m or {}).get("error") or err or "not measured")[:300]
    return row


def measure_bytes(rows, timeout=180.0, per_dtype=False, after_group=None):
    """Profile the cuflash rows of ``rows`` under ncu in one ``ncu.measure_many`` process (or one per dtype)
    and merge the DRAM bytes into the rows in place. ``after_group()`` runs after each process (the caller
    writes the results there). Returns {'processes', 'calls', 'measured', 'errors'} (errors: one line per
    process that failed as a whole: ncu missing, timed out, no metrics)."""
    plans = []
    if per_dtype:
        for dn in dict.fromkeys(r["dtype"] for r in rows):
            idx = [i for i, r in enumerate(rows) if r["dtype"] == dn]
            setup, calls, t = ncu_plan([rows[i] for i in idx])
            plans.append((dn, setup, calls, [idx[k] for k in t]))
    else:
        plans.append(("all", *ncu_plan(rows)))
    out = {"processes": 0, "calls": 0, "measured": 0, "errors": []}
    for what, setup, calls, targets in plans:
        if not calls:
            continue
        print(f"softmax_passes: ncu: profiling {len(calls)} calls ({what}) in one process "
              f"(timeout {timeout:.0f} s) ...", flush=True)
        out["processes"] += 1
        out["calls"] += len(calls)
        try:
            res, err = ncu.measure_many(setup, calls, timeout=timeout), None
        except ncu.NcuUnavailable as e:
            res, err = [None] * len(calls), (str(e).splitlines() or ["ncu failed"])[0][:300]
            out["errors"].append(f"{what}: {err}")
            print(f"softmax_passes: ncu ({what}): {err}", file=sys.stderr)
        for i, m in zip(targets, res):
            merge_measured(rows[i], m, err)
            out["measured"] += rows[i].get("measured_bytes") is not None
        if after_group is not None:
            after_group()
    return out


def run(a, plots, predicted):
    g = gpus.get(a.gpu)
    rows_out = []
    jobs = [(dn, r, c) for dn in a.dtypes.split(",") for r, c in shapes(a)]
    use_ncu = (not predicted) and (a.ncu == "on" or (a.ncu == "auto" and not a.quick)) and ncu.available()
    env = bench.environment() if not predicted else {}
    if not predicted:
        import cupy as cp
        from tqdm import tqdm

        from cuflash import reference
        from cuflash._attention_alt import from_float32

        sm = _sm()
        # copy ceiling in the same run
        copy_gbps = bench.copy_bandwidth(1 << 28, 20)
        th = None
        if not a.no_torch:
            try:
                import torch

                th = torch if torch.cuda.is_available() else None
            except Exception:
                th = None
        bar = tqdm(total=len(jobs) * (len(METHODS) + (1 if th else 0)), desc="softmax_passes", unit="run")
    else:
        copy_gbps = g.copy_GBps()
        bar = None
    for dn, nrows, cols in jobs:
        dt = _dt(dn)
        s = np.dtype(dt).itemsize
        n = nrows * cols
        if not predicted:
            rs = cp.random.RandomState(1)
            nsets = max(1, min(4, (3 * 60 * 2**20) // max(n * s, 1) + 1))
            xs = [(from_float32(rs.standard_normal((nrows, cols), dtype=cp.float32), dt),) for _ in range(nsets)]
            ref = reference.softmax(xs[0][0][:2].get(), axis=-1)
            flush = nsets * n * s < 2 * (env.get("l2_bytes") or 60 * 2**20)
        for label, method, part, model in METHODS:
            mm, k = model_method(method, part, model, dt, nrows, cols, None if predicted else xs[0][0], g)
            nb = traffic.softmax_bytes(nrows, cols, dt, mm, splits=k)
            r = {"kernel": "softmax", "method": label, "model": mm, "splits": k, "dtype": dn,
                 "shape": f"{nrows}x{cols}", "rows": nrows, "cols": cols,
                 "passes_model": nb / (n * s), "bytes_model": nb}
            if predicted:
                r.update(mode="predicted", predicted_for=g.name, ms=gpus.predict_time_s(nb, 0, g) * 1e3)
            else:
                r["mode"] = "measured"
                try:
                    if part is None:
                        def f(x, method=method):
                            return sm.softmax(x, axis=-1, method=method)
                    else:
                        def f(x, method=method, part=part):
                            return sm._softmax_impl(x, -1, sm.OP_SOFTMAX, method, part)
                    e = bench.errors(f(xs[0][0])[:2], ref)
                    r.update(max_abs_err=e["max_abs_err"], max_rel_err=e["max_rel_err"])
                    r["ms"] = bench.time_cuda(f, *xs, warmup=a.warmup, rep=a.rep, flush=flush)["median_ms"]
                except Exception as ex:
                    r["error"] = f"{type(ex).__name__}: {ex}"[:300]
                    print(f"softmax_passes: {label} {dn} {nrows}x{cols}: {r['error']}")
                bar.update(1)
            if r.get("ms"):
                r["GBps_model"] = nb / (r["ms"] * 1e-3) / 1e9
                r["GBps_useful"] = 2 * n * s / (r["ms"] * 1e-3) / 1e9   # read x + write y once
                r["passes_equiv"] = r["ms"] * 1e-3 * copy_gbps * 1e9 / (n * s)
                r["copy_GBps"] = copy_gbps
            rows_out.append(r)
        if not predicted and th is not None:
            r = {"kernel": "softmax", "method": "torch.softmax", "model": "cached", "dtype": dn,
                 "shape": f"{nrows}x{cols}", "rows": nrows, "cols": cols, "passes_model": 2.0,
                 "bytes_model": 2 * n * s, "mode": "measured"}
            try:
                ts = [(to_torch(th, x[0]),) for x in xs]
                r["ms"] = bench.time_cuda(lambda x: th.softmax(x, -1), *ts, warmup=a.warmup, rep=a.rep,
                                          flush=flush)["median_ms"]
                r["GBps_useful"] = 2 * n * s / (r["ms"] * 1e-3) / 1e9
                r["passes_equiv"] = r["ms"] * 1e-3 * copy_gbps * 1e9 / (n * s)
                r["copy_GBps"] = copy_gbps
            except Exception as ex:
                r["error"] = f"{type(ex).__name__}: {ex}"[:300]
            rows_out.append(r)
            bar.update(1)
    if bar:
        bar.close()
    # ratio to torch at the same shape (same run)
    tref = {(r["dtype"], r["shape"]): r.get("ms") for r in rows_out if r["method"] == "torch.softmax"}
    for r in rows_out:
        t = tref.get((r["dtype"], r["shape"]))
        if t and r.get("ms"):
            r["speed_vs_torch"] = t / r["ms"]
    # a --quick run never replaces the committed full run's files: <name>_quick[_predicted]
    name = "softmax_passes" + ("_quick" if a.quick else "") + ("_predicted" if predicted else "")
    meta = {"predicted": predicted, "copy_GBps": copy_gbps, "ncu": use_ncu, "args": vars(a),
            "gpu_table": g.name if predicted else None,
            "ncu_status": "pending: timings written, ncu not finished" if use_ncu else "off",
            "note": ("PREDICTED: time = modeled bytes / copy bandwidth" if predicted else
                     "passes_equiv = time x copy GB/s (same run) / (elements x itemsize)")}
    # the timings first: a run killed while ncu profiles still leaves them
    path = bench.write_results(name, rows_out, meta)
    label = f"PREDICTED for {g.name} (model, no GPU)" if predicted else f"{env.get('gpu')} (measured)"
    plot(rows_out, plots / f"{name}.png", label)
    if use_ncu:
        xs = ts = None   # noqa: F841  (free the timing inputs before the profiled process allocates its own)
        cp.get_default_memory_pool().free_all_blocks()
        if th is not None:
            th.cuda.empty_cache()
        st = measure_bytes(rows_out, a.ncu_timeout, a.ncu_per_dtype,
                           after_group=lambda: bench.write_results(name, rows_out, meta))
        meta.update(ncu_processes=st["processes"], ncu_calls=st["calls"], ncu_measured=st["measured"],
                    ncu_errors=st["errors"], ncu_timeout_s=a.ncu_timeout,
                    ncu_status=("done" if not st["errors"] else "failed: " + "; ".join(st["errors"]))[:500],
                    measured=("ncu dram__bytes_read.sum + dram__bytes_write.sum per call, cold L2 "
                              "(cuflash.ncu.measure_many: one process, marker kernels between calls)"))
        path = bench.write_results(name, rows_out, meta)
    return path, rows_out


def plot(rows, path, label):
    plt = pyplot()

    dts = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(1, max(len(dts), 1), figsize=(6 * max(len(dts), 1), 4.2), squeeze=False)
    for ax, dn in zip(axes[0], dts):
        for m in dict.fromkeys(r["method"] for r in rows):
            rr = [r for r in rows if r["dtype"] == dn and r["method"] == m and r.get("ms")]
            if not rr:
                continue
            y = [r.get("passes_equiv", r["passes_model"]) for r in rr]
            line, = ax.plot([r["cols"] for r in rr], y, "o-", label=m)
            if "passes_equiv" in rr[0] and m != "torch.softmax":
                ax.plot([r["cols"] for r in rr], [r["passes_model"] for r in rr], ":", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row length (cols)")
        ax.set_ylabel("equivalent passes (time x copy BW / bytes)")
        ax.set_title(f"{dn}  (dotted: modeled passes)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Softmax methods: passes over memory vs time — {label}")
    predicted_watermark(fig, label)
    save_figure(fig, path, dpi=110, mkdir=False)


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if not (a.predict or bench.has_gpu()):
        scratch_out(a, "softmax_passes")
    plots = output_dirs(a)
    predicted = predicted_mode(a, f"softmax_passes: no CUDA device: model with roofline-predicted times for {a.gpu} "
                                  f"(PREDICTED)")
    path, rows = run(a, plots, predicted)
    print_results(path, rows, ("method", "dtype", "shape", "passes_model", "passes_equiv", "ms", "GBps_useful",
                               "speed_vs_torch", "measured_over_modeled", "max_abs_err"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
