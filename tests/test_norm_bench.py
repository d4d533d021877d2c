"""pytest-benchmark runs of the norms (GPU): forward, fused residual forward, backward, at 256 MiB of input.

Each case is timed with CUDA events (bench.time_cuda, median of 20 after warm-up; inputs larger than L2) beside a
device copy of the same bytes and torch (when importable), and records GB/s (bytes the op must move), the
fraction of the copy, the ratio to torch and the max abs error against the float64 reference (cuflash.reference,
sampled rows; the backward's dx) in ``benchmark.extra_info``, and, with ``--benchmark-enable``, in
experiments/results/norm_bench.json. pytest-benchmark's own timer (``--benchmark-enable``) times each call with a
stream synchronisation after it (its clock is the host's: without the wait it would time the launch only), so its
figure includes the host work of the call.
The full sweep with the Triton peer and the plot is experiments/norm_sweep.py. These runs report; the
targets (forward >= 0.9 of copy, backward >= 0.8) are asserted loosely (>= 0.5) so a pathological regression fails.
"""
import numpy as np
import pytest

from cuflash import _dtypes, bench, reference, traffic

pytestmark = pytest.mark.gpu

_ROWS = []


def _make(cp, shape, dt, rs, scale=1.0, loc=0.0):
    a = rs.standard_normal(shape, dtype=cp.float32) * scale + loc
    try:
        return a.astype(dt)
    except Exception:  # pragma: no cover
        u = a.view(cp.uint32)
        r = (u >> cp.uint32(16)) & cp.uint32(1)
        return ((u + cp.uint32(0x7FFF) + r) >> cp.uint32(16)).astype(cp.uint16).view(dt)


@pytest.fixture(scope="module", autouse=True)
def _write_results(request):
    yield
    if _ROWS and not request.config.getoption("benchmark_disable", True):  # smoke runs leave no results file
        bench.write_results("norm_bench", _ROWS, {"note": "tests/test_norm_bench.py, 256 MiB of x per case"})


@pytest.mark.parametrize("op", ["fwd", "fwd_res", "bwd"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dt", [np.dtype(np.float32), _dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("hidden", [1024, 8192])
def test_norm_bandwidth(benchmark, cp, op, kind, dt, hidden):
    import cuflash

    rs = cp.random.RandomState(3)
    # 256 MiB: at 64 MiB the backward's GPU time (~50 us) was below its host work per call (~100 us, four launches
    # and their allocations), so the back-to-back timing measured the host (0.42-0.58 of copy on the H200, 72fbfda)
    tokens = (256 << 20) // (hidden * dt.itemsize)
    x = _make(cp, (tokens, hidden), dt, rs, 2.0, 1.0)
    w = _make(cp, (hidden,), dt, rs, 0.1, 1.0)
    b = _make(cp, (hidden,), dt, rs, 0.1)
    wb = (w, b) if kind == "layer" else (w,)
    fn = cuflash.layer_norm if kind == "layer" else cuflash.rms_norm
    if op == "fwd":
        nbytes = traffic.norm_bytes(tokens, hidden, dt, kind)
        f = lambda: fn(x, hidden, *wb)  # noqa: E731
    elif op == "fwd_res":
        r = _make(cp, (tokens, hidden), dt, rs)
        nbytes = traffic.norm_bytes(tokens, hidden, dt, kind, residual=True, fused=True)
        f = lambda: fn(x, hidden, *wb, residual=r)  # noqa: E731
    else:
        dy = _make(cp, (tokens, hidden), dt, rs)
        nbytes = 3 * tokens * hidden * dt.itemsize
        if kind == "layer":
            _, mean, rstd = fn(x, hidden, *wb, return_stats=True)
            f = lambda: cuflash.layer_norm_backward(dy, x, w, mean, rstd)  # noqa: E731
        else:
            _, rstd = fn(x, hidden, *wb, return_stats=True)
            f = lambda: cuflash.rms_norm_backward(dy, x, w, rstd)  # noqa: E731
    t = bench.time_cuda(f, warmup=3, rep=20)["median_ms"]
    src = cp.empty(nbytes // 2, cp.uint8)
    dst = cp.empty_like(src)
    tc = bench.time_cuda(lambda: cp.copyto(dst, src), warmup=3, rep=20)["median_ms"]
    del src, dst
    sample = np.unique(np.r_[0, tokens - 1, np.arange(1, tokens, max(1, tokens // 6))])
    out = f()
    xs, ws, bs = x[sample].get(), w.get(), b.get()
    if op == "fwd":
        ref = (reference.layer_norm(xs, (hidden,), ws, bs) if kind == "layer"
               else reference.rms_norm(xs, (hidden,), ws))
        got = out[sample]
    elif op == "fwd_res":
        hs = (xs.astype(np.float32) + r[sample].get().astype(np.float32)).astype(dt)
        ref = (reference.layer_norm(hs, (hidden,), ws, bs) if kind == "layer"
               else reference.rms_norm(hs, (hidden,), ws))
        got = out[0][sample]
    else:
        m = mean[sample].get() if kind == "layer" else None
        ref = (reference.layer_norm_backward(dy[sample].get(), xs, ws, m, rstd[sample].get()) if kind == "layer"
               else reference.rms_norm_backward(dy[sample].get(), xs, ws, rstd[sample].get()))
        got = out[0][sample]
    err = bench.errors(got.get().astype(np.float64), ref[0])["max_abs_err"]
    del out, got
    row = {"op": op, "kind": kind, "dtype": "bfloat16" if dt == _dtypes.bfloat16 else str(dt), "tokens": tokens,
           "hidden": hidden, "ms": t, "GBps": nbytes / t / 1e6, "copy_GBps": nbytes / tc / 1e6, "frac_copy": tc / t,
           "max_abs_err": err}
    try:
        import torch

        F = torch.nn.functional
        tx = torch.from_dlpack(x)
        tw, tb = torch.from_dlpack(w), torch.from_dlpack(b)
        if op == "fwd":
            g = (lambda: F.layer_norm(tx, (hidden,), tw, tb)) if kind == "layer" else (
                lambda: F.rms_norm(tx, (hidden,), tw))
        elif op == "fwd_res":
            tr = torch.from_dlpack(r)
            g = (lambda: F.layer_norm(tx + tr, (hidden,), tw, tb)) if kind == "layer" else (
                lambda: F.rms_norm(tx + tr, (hidden,), tw))
        else:
            xg, wg = tx.detach().requires_grad_(True), tw.detach().requires_grad_(True)
            yg = F.layer_norm(xg, (hidden,), wg, tb) if kind == "layer" else F.rms_norm(xg, (hidden,), wg)
            tdy = torch.from_dlpack(dy)
            g = lambda: torch.autograd.grad(yg, (xg, wg), tdy, retain_graph=True)  # noqa: E731
        tt = bench.time_cuda(g, warmup=3, rep=20)["median_ms"]
        row.update(torch_GBps=nbytes / tt / 1e6, speed_vs_torch=tt / t)
    except Exception as e:  # torch missing, or no bfloat16 over DLPack
        row["torch"] = f"skipped: {type(e).__name__}"
    _ROWS.append(row)
    benchmark.extra_info.update(row)
    print(row)

    def call():  # pytest-benchmark's clock is the host's: wait for the GPU inside the timed call
        f()
        cp.cuda.get_current_stream().synchronize()

    benchmark.pedantic(call, rounds=20, iterations=1, warmup_rounds=3)
    target = 0.9 if op != "bwd" else 0.8
    print(f"{op} {kind} {row['dtype']} {tokens}x{hidden}: {row['GBps']:.0f} GB/s = {row['frac_copy']:.2f} of copy "
          f"(target {target}); torch {row.get('torch_GBps', float('nan')):.0f} GB/s")
    assert row["frac_copy"] >= 0.5, "far below the copy bandwidth: a performance regression"
    assert err < (0.05 if dt == _dtypes.bfloat16 else 1e-4), f"max abs error {err} against float64"
