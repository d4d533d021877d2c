"""Measured DRAM bytes: run a piece of Python under Nsight Compute and read ``dram__bytes_read.sum`` and
``dram__bytes_write.sum`` for every kernel launch in the measured region.

How: the code is written to a temporary script that runs ``setup`` (allocations), every call once as a warm-up
(so that JIT compilation and cuBLAS initialisation happen outside the region), then ``cudaProfilerStart()``,
the calls, each preceded by an empty marker kernel ``cuflash_ncu_marker_<i>`` and followed by a synchronize,
then ``cudaProfilerStop()``. ``ncu --profile-from-start off`` profiles only the launches in between,
``--clock-control none`` leaves the clocks alone (as the anchors were measured), ``--csv --print-units base``
gives plain bytes. ncu flushes the caches before every profiled kernel (its default ``--cache-control all``),
so the numbers are cold-L2 DRAM bytes per launch: L2 hits *within* a launch still count as saved traffic.

:func:`measure_many` profiles several calls in one ncu process (one Python start-up, one JIT warm-up) and
splits the launches per call at the markers (:func:`split_launches`); :func:`measure` is the one-call case.
Without ``ncu`` on the PATH (or when profiling is not permitted) :func:`available` is False and
:func:`measure` raises :class:`NcuUnavailable`; callers fall back to the model alone.

Example::

    from cuflash import ncu
    setup = "import cupy as cp, cuflash\\nx = cp.random.rand(4096, 4096, dtype=cp.float32)"
    r = ncu.measure(setup=setup, call="cuflash.softmax(x, axis=-1)")
    r["read_bytes"], r["write_bytes"], r["launches"]   # totals and the per-launch rows
    a, b = ncu.measure_many(setup, ["cuflash.softmax(x, axis=-1)", "cuflash.logsumexp(x, axis=-1)"])
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
_UNITS = {"byte": 1, "bytes": 1, "b": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
          "kibyte": 1024, "mibyte": 1024 ** 2, "gibyte": 1024 ** 3}
ROOT = Path(__file__).resolve().parent.parent


class NcuUnavailable(RuntimeError):
    """ncu is not installed, not permitted to profile, or produced no metrics."""


def ncu_path() -> str | None:
    """The ncu executable (PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin), or None."""
    p = shutil.which("ncu")
    if p:
        return p
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "ncu").is_file():
            return str(Path(root, "bin", "ncu"))
    return None


def available() -> bool:
    """True when an ncu executable is found (and CUFLASH_NO_NCU is not set)."""
    return not os.environ.get("CUFLASH_NO_NCU") and ncu_path() is not None


MARKER = "cuflash_ncu_marker"
_MARKER_RE = re.compile(MARKER + r"_(\d+)")


def _marker_source(n: int) -> str:
    """CUDA source of ``n`` empty kernels ``cuflash_ncu_marker_<i>`` (C linkage: the name is the index)."""
    return "\n".join(f'extern "C" __global__ void {MARKER}_{i}() {{}}' for i in range(n))


def _script(setup: str, calls, repeat: int, status_path: str | None = None) -> str:
    """The profiled program: ``setup``; every call once as warm-up (JIT, cuBLAS handles, allocator), outside the
    profiled range; then ONE range (``cudaProfilerStart`` .. ``cudaProfilerStop``) in which call ``i`` is
    preceded by the empty kernel ``cuflash_ncu_marker_<i>`` and followed by a synchronize. A call that raises in
    the warm-up is skipped; its error (and any raised inside the range) goes to ``status_path`` as JSON."""
    if isinstance(calls, str):
        calls = [calls]
    lines = ["import json, sys",
             f"sys.path.insert(0, {str(ROOT)!r})",
             "import cupy",
             "import cupy.cuda.profiler as _prof",
             textwrap.dedent(setup)]
    for i, call in enumerate(calls):
        lines += [f"def _cuflash_call_{i}():",
                  textwrap.indent(textwrap.dedent(call).strip() or "pass", "    ")]
    n = len(calls)
    lines += [
        f"_cuflash_calls = [{', '.join(f'_cuflash_call_{i}' for i in range(n))}]",
        f"_cuflash_mod = cupy.RawModule(code={_marker_source(n)!r})",
        f"_cuflash_markers = [_cuflash_mod.get_function('{MARKER}_%d' % i) for i in range({n})]",
        "_cuflash_err = [None] * len(_cuflash_calls)",
        "def _cuflash_save():",
        f"    if {status_path!r}:",
        f"        with open({status_path!r}, 'w') as f:",
        "            json.dump(_cuflash_err, f)",
        "for _i, _f in enumerate(_cuflash_calls):  # warm-up, not profiled",
        "    try:",
        "        _cuflash_markers[_i]((1,), (1,), ())",
        "        _f()",
        "        cupy.cuda.Device().synchronize()",
        "    except Exception as _e:",
        "        _cuflash_err[_i] = 'warm-up: %s: %s' % (type(_e).__name__, _e)",
        "_cuflash_save()",
        "cupy.cuda.Device().synchronize()",
        "_prof.start()",
        "for _i, _f in enumerate(_cuflash_calls):",
        "    if _cuflash_err[_i] is not None:",
        "        continue",
        "    try:",
        "        _cuflash_markers[_i]((1,), (1,), ())",
        f"        for _ in range({int(repeat)}):",
        "            _f()",
        "        cupy.cuda.Device().synchronize()",
        "    except Exception as _e:",
        "        _cuflash_err[_i] = '%s: %s' % (type(_e).__name__, _e)",
        "    _cuflash_save()",
        "_prof.stop()",
        "",
    ]
    return "\n".join(lines)


def parse_csv(text: str) -> list[dict]:
    """Per-launch rows from ``ncu --csv`` output: {'id', 'kernel', 'read_bytes', 'write_bytes', 'metrics'}, where
    'metrics' maps every numeric metric of the launch to its value (bytes in bytes, other units as printed)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    rows: dict[int, dict] = {}
    for rec in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        try:
            lid = int(rec["ID"])
        except (KeyError, TypeError, ValueError):
            continue
        name = rec.get("Metric Name", "")
        unit = (rec.get("Metric Unit") or "byte").strip().lower()
        raw = (rec.get("Metric Value") or "").replace(",", "").strip()
        try:
            val = float(raw) * _UNITS.get(unit, 1)
        except ValueError:
            continue
        r = rows.setdefault(lid, {"id": lid, "kernel": rec.get("Kernel Name", ""), "read_bytes": 0.0,
                                  "write_bytes": 0.0, "metrics": {}})
        r["metrics"][name] = val
        if name == METRICS[0]:
            r["read_bytes"] = val
        elif name == METRICS[1]:
            r["write_bytes"] = val
    return [rows[k] for k in sorted(rows)]


def split_launches(launches: list[dict], n_calls: int, repeat: int = 1, errors=None) -> list[dict]:
    """Cut the per-launch rows of :func:`parse_csv` into one result per call at the marker kernels.

    A launch belongs to the call whose marker (``cuflash_ncu_marker_<i>``) came last before it; launches before
    any marker are dropped, marker launches are excluded from the totals. Each result: {'read_bytes',
    'write_bytes', 'bytes' (per repetition: totals / ``repeat``), 'launches', 'n_launches', 'error'}. A call
    with an entry in ``errors`` or whose marker never appeared gets the bytes None and an 'error' string.
    """
    errors = list(errors or [])
    groups: dict[int, list[dict]] = {}
    current = None
    for r in launches:
        m = _MARKER_RE.search(r.get("kernel", ""))
        if m:
            current = int(m.group(1))
            groups.setdefault(current, [])
        elif current is not None:
            groups[current].append(r)
    out = []
    for i in range(n_calls):
        err = errors[i] if i < len(errors) else None
        if err is None and i not in groups:
            err = "no marker in the ncu output: the call was not profiled"
        rows = groups.get(i, [])
        if err is not None:
            out.append({"read_bytes": None, "write_bytes": None, "bytes": None, "launches": rows,
                        "n_launches": len(rows), "error": err})
            continue
        rd = sum(r["read_bytes"] for r in rows) / max(repeat, 1)
        wr = sum(r["write_bytes"] for r in rows) / max(repeat, 1)
        out.append({"read_bytes": rd, "write_bytes": wr, "bytes": rd + wr, "launches": rows,
                    "n_launches": len(rows), "error": None})
    return out


def measure_many(setup: str, calls, repeat: int = 1, kernel_regex: str | None = None, timeout: float = 600,
                 env: dict | None = None, python: str | None = None, metrics=()) -> list[dict]:
    """Profile several calls (Python source strings, sharing ``setup``) in ONE ncu process; one result each.

    The program of :func:`_script` runs every call once outside the profiled range (warm-up), then each call
    after an empty marker kernel named for its index, all in one profiled range; :func:`split_launches` cuts the
    launches at the markers. Returns a list (in the order of ``calls``) of {'read_bytes', 'write_bytes',
    'bytes', 'launches', 'n_launches', 'error'}: bytes are per repetition, None with an 'error' when the call
    raised (the exception text) or was not profiled. ``kernel_regex`` keeps only matching kernels (and the
    markers). Raises NcuUnavailable when ncu is missing, or returns no metric rows at all (not even a
    marker) while some call ran. ``metrics``: more ncu metric names (or ``regex:`` patterns) to collect beside the
    DRAM bytes; each launch row carries them in its 'metrics' dict.
    """
    calls = [calls] if isinstance(calls, str) else list(calls)
    exe = ncu_path()
    if exe is None or os.environ.get("CUFLASH_NO_NCU"):
        raise NcuUnavailable("ncu not found")
    with tempfile.TemporaryDirectory(prefix="cuflash_ncu_") as d:
        path, status = Path(d, "region.py"), Path(d, "status.json")
        path.write_text(_script(setup, calls, repeat, str(status)))
        cmd = [exe, "--clock-control", "none", "--profile-from-start", "off", "--metrics",
               ",".join((*METRICS, *metrics)),
               "--csv", "--print-units", "base"]
        if kernel_regex:
            cmd += ["-k", f"regex:(?:{kernel_regex})|{MARKER}"]
        cmd += [python or sys.executable, str(path)]
        e = dict(os.environ, **(env or {}))
        e.setdefault("PYTHONPATH", str(ROOT))
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        except subprocess.TimeoutExpired as ex:
            raise NcuUnavailable(f"ncu timed out after {timeout} s") from ex
        try:
            errors = json.loads(status.read_text())
        except (OSError, ValueError):
            errors = []
    launches = parse_csv(res.stdout)
    all_failed = len(errors) == len(calls) and all(e is not None for e in errors)
    if not launches and not all_failed:   # not even a marker: profiling itself failed
        tail = (res.stdout + res.stderr)[-2000:]
        raise NcuUnavailable(f"ncu returned no metrics (rc {res.returncode}): {tail}")
    return split_launches(launches, len(calls), repeat, errors)


def measure(call: str, setup: str = "", repeat: int = 1, kernel_regex: str | None = None, timeout: float = 300,
            env: dict | None = None, python: str | None = None) -> dict:
    """Run ``setup`` then ``call`` (Python source; ``call`` may span lines) under ncu; return measured bytes.

    :func:`measure_many` with one call. Returns {'read_bytes', 'write_bytes', 'bytes' (their sum, per
    repetition), 'launches' (per-launch rows of :func:`parse_csv`), 'n_launches', 'error' (None)}. ``repeat``
    runs the call that many times inside the region and divides the totals by it. ``kernel_regex`` keeps only
    kernels whose name matches (ncu ``-k regex:``). Raises NcuUnavailable when ncu is missing, returns no metric
    rows, or the call failed (the message holds the error or ncu's output tail).
    """
    r = measure_many(setup, [call], repeat, kernel_regex, timeout, env, python)[0]
    if r["error"] is not None:
        raise NcuUnavailable(f"the profiled call failed: {r['error']}")
    return r


def try_measure(call: str, setup: str = "", **kw) -> dict | None:
    """:func:`measure`, or None (with a one-line note on stderr) when ncu is unavailable or fails."""
    if not available():
        return None
    try:
        return measure(call, setup, **kw)
    except NcuUnavailable as e:
        print(f"ncu: {str(e).splitlines()[0] if str(e) else e}", file=sys.stderr)
        return None


def compare(measured: float | None, modeled: float, tol: float = 0.10) -> dict:
    """{'measured_bytes', 'modeled_bytes', 'measured_over_modeled', 'model_note'}: the note says when the two
    differ by more than ``tol`` (usually L2 hits serving re-reads, or write-allocate / partial sectors)."""
    if measured is None or not modeled:
        return {"measured_bytes": measured, "modeled_bytes": modeled, "measured_over_modeled": None,
                "model_note": "" if measured is None else "model is 0"}
    r = float(measured) / float(modeled)
    note = ""
    if r < 1 - tol:
        note = f"measured {r:.2f}x model: fewer DRAM bytes than the schedule asks (L2 hits on re-reads)"
    elif r > 1 + tol:
        note = f"measured {r:.2f}x model: more DRAM bytes than the schedule (extra passes, write-allocate, spills)"
    return {"measured_bytes": float(measured), "modeled_bytes": int(modeled), "measured_over_modeled": r,
            "model_note": note}
