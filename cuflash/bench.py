"""Timing, error metrics and result files: the numbers every report row is made of.

Timing follows the usual GPU method: CUDA events around the region on the current stream, repetitions enqueued
back to back (the host waits once, so Python work before a launch is hidden while the GPU is busy), warm-up
first, the median of many repetitions, and inputs either larger than L2 or rotated between calls (pass several
argument sets to :func:`time_cuda`), with an optional L2 flush before every repetition.
"""
from __future__ import annotations

import csv as csvlib
import datetime as _dt
import io
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
PLOTS = ROOT / "plots"


def has_gpu() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


_FLUSH = {}


def flush_l2() -> None:
    """Write a buffer twice the L2 size so that the next kernel reads its inputs from HBM."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    buf = _FLUSH.get(dev)
    if buf is None:
        l2 = cupy.cuda.runtime.getDeviceProperties(dev)["l2CacheSize"]
        buf = _FLUSH[dev] = cupy.empty(2 * max(l2, 1 << 20) // 4, dtype=np.float32)
    buf.fill(1.0)


def time_cuda(fn, *arg_sets, warmup: int = 3, rep: int = 30, flush: bool = False, sync_each: bool = False) -> dict:
    """Time ``fn(*args)`` with CUDA events; returns {'median_ms', 'min_ms', 'p20_ms', 'p80_ms', 'n'}.

    ``arg_sets`` are tuples of arguments rotated between repetitions (several sets whose total exceeds L2
    keep the cache from serving the inputs); with none, ``fn()`` is called. ``flush=True`` also flushes L2
    before every repetition (the flush itself is outside the timed region).

    The repetitions are enqueued back to back, one (start, end) event pair around each, and the host waits once
    at the end (as ``triton.testing.do_bench``): while the GPU is the bottleneck the host runs ahead, so a
    repetition's time is its GPU time, not the Python work before its launch. ``sync_each=True`` waits after every
    repetition instead: the time then includes the host work of the call (latency of one isolated call).

    Raises ValueError, before anything is launched, when ``rep`` < 1 or ``warmup`` < 0.
    """
    if rep < 1:
        raise ValueError(f"time_cuda: rep must be at least 1, got {rep!r}")
    if warmup < 0:
        raise ValueError(f"time_cuda: warmup must be at least 0, got {warmup!r}")
    import cupy

    sets = arg_sets or ((),)
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    pairs = []
    for i in range(rep):
        if flush:
            flush_l2()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        fn(*sets[i % len(sets)])
        end.record(stream)
        pairs.append((start, end))
        if sync_each:
            end.synchronize()
    stream.synchronize()
    t = np.asarray([cupy.cuda.get_elapsed_time(a, b) for a, b in pairs])
    return {"median_ms": float(np.median(t)), "min_ms": float(t.min()), "p20_ms": float(np.percentile(t, 20)),
            "p80_ms": float(np.percentile(t, 80)), "n": rep}


def copy_bandwidth(nbytes: int, rep: int = 30) -> float:
    """Device-to-device copy of ``nbytes`` (CuPy, the current device), GB/s counted as bytes read + written: the
    ceiling a memory-bound kernel is reported against, timed in the same run."""
    import cupy

    src = cupy.empty(nbytes, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    ms = time_cuda(lambda: cupy.copyto(dst, src), warmup=3, rep=rep)["median_ms"]
    return 2 * nbytes / (ms * 1e-3) / 1e9


def time_rotated(fns: dict, rounds: int = 5, warmup: int = 3, rep: int = 6) -> dict:
    """Time several contenders on the same work in turn: ``rounds`` rounds, each timing every ``fns[name]()`` with
    :func:`time_cuda` (``rep`` repetitions, one warm-up call), in the order of ``fns`` rotated by one every second
    round and reversed every other round (three contenders: all six orders in six rounds), so that no contender
    always runs first or after the same one (a GPU held at its power limit runs the same kernel several per
    cent slower after a long heavy run than on a cool start). Returns {name: {'median_ms': the median of the round
    medians, 'rounds_ms': the round medians, 'n': rounds * rep}}; ``warmup`` calls of each before the first round.
    """
    names = list(fns)
    for nm in names:
        for _ in range(warmup):
            fns[nm]()
    got = {nm: [] for nm in names}
    for r in range(rounds):
        s = (r // 2) % len(names)
        order = names[s:] + names[:s]
        for nm in (order[::-1] if r % 2 else order):
            got[nm].append(time_cuda(fns[nm], warmup=1, rep=rep)["median_ms"])
    return {nm: {"median_ms": float(np.median(v)), "rounds_ms": v, "n": rounds * rep} for nm, v in got.items()}


def host_us_per_call(fn, calls: int = 2000, warmup: int = 50, sync=None) -> float:
    """Host time of one call in microseconds: ``calls`` calls enqueued back to back (after ``warmup``), the device
    waited for before and after. On an input small enough that the GPU keeps up with the launches this is the
    Python and launch cost a caller pays per call, which :func:`time_cuda` leaves out. ``sync``: the wait
    (default: the current CuPy device's synchronize)."""
    import time

    if sync is None:
        import cupy

        sync = cupy.cuda.Device().synchronize
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def _host_float64(a) -> np.ndarray:
    """``a`` (CuPy or NumPy array, or anything ``np.asarray`` takes) as a float64 NumPy array."""
    return np.asarray(a.get() if hasattr(a, "get") else a).astype(np.float64)


def errors(out, ref) -> dict:
    """Errors of ``out`` against ``ref`` (CuPy or NumPy arrays of the same shape, compared in float64).

    Returns {'max_abs_err', 'max_rel_err', 'mean_abs_err', 'nonfinite_mismatch'}: over the positions where both
    are finite, the max and mean of |out - ref| and the max of |out - ref| / max(|ref|, 1e-30) (so ref = 0 with
    out != 0 gives a huge ratio, out = ref = 0 gives 0); ``nonfinite_mismatch`` counts the positions whose
    finiteness differs (one finite and the other not, or different non-finite values: +inf against -inf or NaN).
    Where that count is not 0 the three errors are inf, so that a NaN or inf output never reads as a small error;
    positions where both are the same non-finite value (+inf, -inf, NaN) agree and count nowhere.
    Raises ValueError when the shapes differ (no broadcasting).
    """
    o, r = _host_float64(out), _host_float64(ref)
    if o.shape != r.shape:
        raise ValueError(f"errors: output shape {o.shape} differs from reference shape {r.shape}")
    fin = np.isfinite(o) & np.isfinite(r)
    same = (o == r) | (np.isnan(o) & np.isnan(r))
    mismatch = int((~fin & ~same).sum())
    if mismatch:
        return {"max_abs_err": math.inf, "max_rel_err": math.inf, "mean_abs_err": math.inf,
                "nonfinite_mismatch": mismatch}
    o, r = o[fin], r[fin]
    d = np.abs(o - r)
    rel = d / np.maximum(np.abs(r), 1e-30)
    return {"max_abs_err": float(d.max(initial=0.0)), "max_rel_err": float(rel.max(initial=0.0)),
            "mean_abs_err": float(d.mean()) if d.size else 0.0, "nonfinite_mismatch": 0}


def git_commit() -> str:
    try:
        c = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "cuflash", "cuda_src"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (c or "unknown") + ("+dirty" if dirty else "")
    except Exception:
        return os.environ.get("CUFLASH_COMMIT", "unknown")


def source_hashes() -> dict:
    """sha256 (16 hex digits) of the kernel sources (``cuda_src/``, the hash in every kernel's cache key) and of
    the package's Python files: a record names the code that ran even where git cannot (a copy of the tree without
    its history, or with a stale one); recompute them at a commit to match a record to it."""
    from . import _compile

    return {"cuda_src": _compile.source_hash(), "cuflash_py": _compile.tree_hash(Path(__file__).resolve().parent,
                                                                                  (".py",))}


def environment() -> dict:
    """GPU name, SM count, L2, driver/runtime and library versions, commit, source hashes, command, time."""
    env = {"commit": os.environ.get("CUFLASH_COMMIT") or git_commit(), "source_hashes": source_hashes(),
           "command": " ".join(sys.argv),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "numpy": np.__version__}
    try:
        import cupy

        env["cupy"] = cupy.__version__
        if has_gpu():
            dev = cupy.cuda.runtime.getDevice()
            p = cupy.cuda.runtime.getDeviceProperties(dev)
            env.update(gpu=p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"]),
                       sm_count=p["multiProcessorCount"], l2_bytes=p["l2CacheSize"],
                       compute_capability=f"{p['major']}.{p['minor']}",
                       driver=cupy.cuda.runtime.driverGetVersion(), runtime=cupy.cuda.runtime.runtimeGetVersion())
        else:
            env["gpu"] = None
    except Exception as e:  # pragma: no cover
        env["gpu"] = None
        env["cupy_error"] = repr(e)
    return env


def write_results(name: str, rows: list[dict], meta: dict | None = None, csv: bool = True) -> Path:
    """Write ``experiments/results/<name>.json`` (environment + meta + rows) and ``<name>.csv``; returns the JSON
    path.

    ``name`` may name a sub-folder of the results folder (``"logs/run_1"``), which is created; raises ValueError
    for an empty or absolute name or one with a ``..`` part. The JSON is strict (no NaN/Infinity literals): a
    non-finite float anywhere in the document is written as the string "nan", "inf" or "-inf". The CSV (csv
    module quoting) has one column per key of the rows, then ``gpu`` and ``commit`` from the environment (a row's
    own value of those keys wins); floats are written to 6 significant digits, None as an empty cell.
    """
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts:
        raise ValueError(f"write_results: name must be a relative path inside the results folder, got {name!r}")
    env = environment()
    doc = {"environment": env, "meta": meta or {}, "rows": rows}
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite_json(doc), indent=1, default=_jsonable, allow_nan=False))
    if csv and rows:
        cols = list(dict.fromkeys([k for r in rows for k in r] + ["gpu", "commit"]))
        buf = io.StringIO()
        w = csvlib.writer(buf, lineterminator="\n")
        w.writerow(cols)
        run = {"gpu": env.get("gpu"), "commit": env.get("commit")}
        for r in rows:
            w.writerow([_csv({**run, **r}.get(c)) for c in cols])
        (RESULTS / f"{name}.csv").write_text(buf.getvalue())
    return path


def _finite_json(o):
    """``o`` with every non-finite float (Python or NumPy) in its dicts, lists and tuples made a string."""
    if isinstance(o, dict):
        return {k: _finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite_json(v) for v in o]
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(o) else str(float(o))  # "nan", "inf", "-inf"
    return o


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)


def _csv(v):
    """A CSV cell: floats (Python or NumPy) to 6 significant digits, None empty, anything else as is."""
    if v is None:
        return ""
    return f"{v:.6g}" if isinstance(v, (float, np.floating)) else v


def _cell(v) -> str:
    """A Markdown table cell: numbers (Python or NumPy floats to 4 significant digits), None empty, ``|`` escaped."""
    if v is None:
        return ""
    s = f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)
    return s.replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict], cols: list[str]) -> str:
    """A Markdown table (returned as a string) of ``rows`` restricted to ``cols``: floats (Python or NumPy) to 4
    significant digits, None or a missing key as an empty cell, ``|`` in a cell escaped as ``\\|``."""
    out = ["| " + " | ".join(_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(out)
