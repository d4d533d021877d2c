"""Shared fixtures. GPU tests carry the ``gpu`` marker and skip with a reason when no CUDA device is present.

With ``CUFLASH_GPU_RECORD=<path>`` set, the session writes a JSON record of the run there (commit, GPU,
passed/failed/skipped counts and the failing test ids): the GPU record the project commits.

On a GPU with pytest-xdist (``-n N``), the controller first compiles every declared kernel into CuPy's on-disk
cache, N subprocesses at a time, so that the workers load cubins instead of each compiling the same kernels
(``CUFLASH_WARM_CACHE=0`` skips it).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from cuflash import bench

HAS_GPU = bench.has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device visible to CuPy: GPU test skipped")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_WARM_SCRIPT = r"""
import json, sys
from cuflash import _compile
for source, name, opts in json.load(sys.stdin):
    _compile.get_kernel(source, name, tuple(opts))
"""


def warm_cache_enabled() -> bool:
    """The controller's kernel-cache warm-up is not switched off (``CUFLASH_WARM_CACHE=0``)."""
    return os.environ.get("CUFLASH_WARM_CACHE", "1") != "0"


def cache_warmed_by_controller() -> bool:
    """In an xdist worker whose controller warmed the kernel cache (see the module docstring)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and warm_cache_enabled()


def pytest_sessionstart(session):
    """xdist controller on a GPU machine: fill CuPy's kernel cache before the workers start (see the docstring)."""
    config = session.config
    jobs = getattr(config.option, "numprocesses", None)
    if (not HAS_GPU or hasattr(config, "workerinput") or not jobs or not isinstance(jobs, int)
            or not warm_cache_enabled()):
        return
    from cuflash import _compile

    entries = [(s, n, list(o)) for (s, n, o, _release) in _compile.declared()]
    chunks = [c for c in (entries[i::jobs] for i in range(jobs)) if c]
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", _WARM_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in chunks]
    failed = 0
    for pr, c in zip(procs, chunks):
        out, _ = pr.communicate(json.dumps(c))
        if pr.returncode != 0:  # the tests that use these kernels will compile them and report the error
            failed += 1
            print(f"kernel cache warm-up: a compile process failed (rc {pr.returncode}): {out[-500:]}")
    print(f"kernel cache warm-up: {len(entries)} kernels in {len(procs)} processes, {time.time() - t0:.0f} s"
          + (f", {failed} processes failed" if failed else ""))


_OUTCOMES = {"passed": [], "failed": [], "skipped": []}


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _OUTCOMES.setdefault(report.outcome, []).append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("CUFLASH_GPU_RECORD")
    if not path or hasattr(session.config, "workerinput"):  # xdist workers: the controller writes the record
        return
    rec = {"environment": bench.environment(), "exitstatus": int(exitstatus),
           "counts": {k: len(v) for k, v in _OUTCOMES.items()}, "failed": _OUTCOMES.get("failed", []),
           "args": session.config.invocation_params.args}
    with open(path, "w") as f:
        json.dump(rec, f, indent=1, default=str)


@pytest.fixture
def rng(request):
    """A fresh generator per test (seeded from the test id and a per-run salt printed on failure)."""
    salt = int(os.environ.get("CUFLASH_SEED", np.random.SeedSequence().entropy % (2**32)))
    seed = (hash(request.node.nodeid) ^ salt) % (2**32)
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.fixture
def cp():
    """The cupy module (GPU tests only)."""
    import cupy

    return cupy


def poison(arr, value=np.nan):
    """Fill an output buffer with a value no kernel would write, so unwritten elements show."""
    arr.fill(value)
    return arr
