"""pytest-benchmark runs of the softmax family next to its peers (GPU only; every timed call synchronises).

Run with ``pytest tests/test_softmax_bench.py --benchmark-enable`` on the GPU; in the default test run
(``--benchmark-disable``) each benchmark body runs once as a smoke test. Shapes: about 64 MiB of input, short,
medium and long rows. GB/s in ``extra_info`` counts bytes read + written once. The full sweep with plots is
``experiments/softmax_sweep.py``.
"""
import importlib

import numpy as np
import pytest

from cuflash import _dtypes

sm = importlib.import_module("cuflash.softmax")
pytestmark = pytest.mark.gpu
SHAPES = [(16384, 1024), (1024, 16384), (16, 1048576)]  # 64 MiB of float32
DTYPES = {"float32": _dtypes.float32, "bfloat16": _dtypes.bfloat16}


def _x(rows, cols, dt):
    import cupy as cp

    return cp.random.standard_normal((rows, cols), dtype=cp.float32).astype(dt)


def _timed(benchmark, fn, nbytes):
    import cupy as cp

    def call():
        fn()
        cp.cuda.get_current_stream().synchronize()

    benchmark.pedantic(call, rounds=20, iterations=1, warmup_rounds=3)
    if benchmark.stats is not None:  # None with --benchmark-disable
        benchmark.extra_info["GBps"] = nbytes / benchmark.stats.stats.median / 1e9


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("method", ["online", "safe", "naive"])
def test_bench_cuflash_softmax(benchmark, shape, dname, method):
    x = _x(*shape, DTYPES[dname])
    benchmark.group = f"softmax {dname} {shape[0]}x{shape[1]}"
    _timed(benchmark, lambda: sm.softmax(x, axis=-1, method=method), 2 * x.nbytes)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
@pytest.mark.parametrize("dname", list(DTYPES))
def test_bench_cuflash_logsumexp(benchmark, shape, dname):
    x = _x(*shape, DTYPES[dname])
    benchmark.group = f"logsumexp {dname} {shape[0]}x{shape[1]}"
    _timed(benchmark, lambda: sm.logsumexp(x, axis=-1), x.nbytes)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
@pytest.mark.parametrize("dname", list(DTYPES))
def test_bench_peers(benchmark, shape, dname):
    torch = pytest.importorskip("torch")
    t = torch.randn(*shape, device="cuda", dtype=getattr(torch, dname))
    benchmark.group = f"softmax {dname} {shape[0]}x{shape[1]}"
    _timed(benchmark, lambda: torch.softmax(t, -1), 2 * t.numel() * t.element_size())


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_bench_copy(benchmark, shape):
    import cupy as cp

    x = _x(*shape, np.float32)
    y = cp.empty_like(x)
    benchmark.group = f"softmax float32 {shape[0]}x{shape[1]}"
    _timed(benchmark, lambda: cp.copyto(y, x), 2 * x.nbytes)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_bench_cupyx(benchmark, shape):
    import cupyx.scipy.special as cxs

    x = _x(*shape, np.float32)
    benchmark.group = f"softmax float32 {shape[0]}x{shape[1]}"
    _timed(benchmark, lambda: cxs.softmax(x, axis=-1), 2 * x.nbytes)
