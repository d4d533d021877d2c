"""Shared fixtures. GPU tests carry the ``gpu`` marker and skip with a reason when no CUDA device is present.

With ``CUFLASH_GPU_RECORD=<path>`` set, the session writes a JSON record of the run there (commit, GPU,
passed/failed/skipped counts and the failing test ids): the GPU record the project commits.
"""
import json
import os

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
