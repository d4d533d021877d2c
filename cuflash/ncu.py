"""Measured DRAM bytes: run a piece of Python under Nsight Compute and read ``dram__bytes_read.sum`` and
``dram__bytes_write.sum`` for every kernel launch in the measured region.

How: the code is written to a temporary script that runs ``setup`` (allocations, a warm-up call so that JIT
compilation and cuBLAS initialisation happen outside the region), then ``cudaProfilerStart()``, the ``call``,
a synchronize, ``cudaProfilerStop()``. ``ncu --profile-from-start off`` profiles only the launches in between,
``--clock-control none`` leaves the clocks alone (as the anchors were measured), ``--csv --print-units base``
gives plain bytes. Each kernel is replayed by ncu with caches flushed between passes (ncu's default
``--cache-control all``), so the numbers are cold-L2 DRAM bytes per launch.

Without ``ncu`` on the PATH (or when profiling is not permitted) :func:`available` is False and
:func:`measure` raises :class:`NcuUnavailable`; callers fall back to the model alone.

Example::

    from cuflash import ncu
    r = ncu.measure(setup="import cupy as cp, cuflash\\nx = cp.random.rand(4096, 4096, dtype=cp.float32)",
                    call="cuflash.softmax(x, axis=-1)")
    r["read_bytes"], r["write_bytes"], r["launches"]   # totals and the per-launch rows
"""
from __future__ import annotations

import csv
import io
import os
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


def _script(setup: str, call: str, repeat: int) -> str:
    body = textwrap.indent(textwrap.dedent(call).strip() or "pass", "    ")
    return "\n".join([
        "import sys",
        f"sys.path.insert(0, {str(ROOT)!r})",
        "import cupy",
        "import cupy.cuda.profiler as _prof",
        textwrap.dedent(setup),
        "def _cuflash_call():",
        body,
        "_cuflash_call()  # warm-up: JIT, cuBLAS handles, allocator",
        "cupy.cuda.Device().synchronize()",
        "_prof.start()",
        f"for _ in range({int(repeat)}):",
        "    _cuflash_call()",
        "cupy.cuda.Device().synchronize()",
        "_prof.stop()",
        "",
    ])


def parse_csv(text: str) -> list[dict]:
    """Per-launch rows from ``ncu --csv`` output: {'id', 'kernel', 'read_bytes', 'write_bytes'}."""
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
                                  "write_bytes": 0.0})
        if name == METRICS[0]:
            r["read_bytes"] = val
        elif name == METRICS[1]:
            r["write_bytes"] = val
    return [rows[k] for k in sorted(rows)]


def measure(call: str, setup: str = "", repeat: int = 1, kernel_regex: str | None = None, timeout: float = 300,
            env: dict | None = None, python: str | None = None) -> dict:
    """Run ``setup`` then ``call`` (Python source; ``call`` may span lines) under ncu; return measured bytes.

    Returns {'read_bytes', 'write_bytes', 'bytes' (their sum, per repetition), 'launches' (per-launch rows of
    :func:`parse_csv`), 'n_launches'}. ``repeat`` runs the call that many times inside the region and divides
    the totals by it. ``kernel_regex`` keeps only kernels whose name matches (ncu ``-k regex:``).
    Raises NcuUnavailable when ncu is missing or returns no metric rows (the message holds ncu's output tail).
    """
    exe = ncu_path()
    if exe is None or os.environ.get("CUFLASH_NO_NCU"):
        raise NcuUnavailable("ncu not found")
    with tempfile.TemporaryDirectory(prefix="cuflash_ncu_") as d:
        path = Path(d, "region.py")
        path.write_text(_script(setup, call, repeat))
        cmd = [exe, "--clock-control", "none", "--profile-from-start", "off", "--metrics", ",".join(METRICS),
               "--csv", "--print-units", "base"]
        if kernel_regex:
            cmd += ["-k", f"regex:{kernel_regex}"]
        cmd += [python or sys.executable, str(path)]
        e = dict(os.environ, **(env or {}))
        e.setdefault("PYTHONPATH", str(ROOT))
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
        except subprocess.TimeoutExpired as ex:
            raise NcuUnavailable(f"ncu timed out after {timeout} s") from ex
    launches = parse_csv(res.stdout)
    if not launches:
        tail = (res.stdout + res.stderr)[-2000:]
        raise NcuUnavailable(f"ncu returned no metrics (rc {res.returncode}): {tail}")
    rd = sum(r["read_bytes"] for r in launches) / max(repeat, 1)
    wr = sum(r["write_bytes"] for r in launches) / max(repeat, 1)
    return {"read_bytes": rd, "write_bytes": wr, "bytes": rd + wr, "launches": launches,
            "n_launches": len(launches)}


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
