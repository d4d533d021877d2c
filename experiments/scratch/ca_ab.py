"""Same-run A/B (#3, #4) of cp.async through L1 (.ca) instead of L2 only (.cg) in the memory-bound kernels:
run in main's tree (abm/) and here, interleaved (experiments/scratch/ca_call.sh). One run: softmax (online, rows of
32K-1M columns), the LayerNorm forward on its streamed and shared-memory-chunk paths, and the LayerNorm / RMSNorm
backward (streamed and cluster), ~256 MiB of x each, CUDA events (3 warm-ups, median of 30), the 1 GiB copy of
the same run; GB/s counts x and y once (backward: x, dy and dx); max rel err of the output against float64 on
sampled rows (softmax, forward) or of dx against the float64 backward given the kernel's statistics.
    PYTHONPATH=. python experiments/scratch/ca_ab.py NAME"""
import sys

import cupy as cp
import numpy as np

import cuflash
from cuflash import _dtypes, bench, reference

NBYTES = 256 << 20
SOFTMAX = [("float32", 32768), ("float32", 131072), ("float32", 262144), ("float32", 524288), ("float32", 1048576),
           ("bfloat16", 65536), ("bfloat16", 262144), ("bfloat16", 524288), ("bfloat16", 1048576)]
FWD = [("bfloat16", 32768), ("float32", 16384), ("bfloat16", 65536)]
BWD = [("layer", "bfloat16", 4096), ("layer", "bfloat16", 16384), ("layer", "bfloat16", 32768),
       ("rms", "bfloat16", 32768), ("layer", "float32", 8192), ("layer", "float32", 32768)]


def rel(a, b):
    a, b = cp.asarray(a, cp.float64), cp.asarray(b, cp.float64)
    return float((cp.abs(a - b) / cp.maximum(cp.abs(b), 1e-30)).max())


def main(name):
    copy = bench.copy_bandwidth(1 << 30)
    out = []

    def rec(what, dname, n, ms, nbytes, err):
        f = nbytes / (ms * 1e-3) / 1e9 / copy
        out.append(dict(op=what, dtype=dname, n=n, ms=ms, frac_copy=f, err=err))
        print(f"{what} {dname} {n}: {f:.3f} of copy ({ms * 1e3:.1f} us), err {err:.2g}", flush=True)

    for dname, n in SOFTMAX:
        dt = getattr(_dtypes, dname)
        x = cp.random.standard_normal((NBYTES // (n * dt.itemsize), n), dtype=cp.float32).astype(dt)
        y = cuflash.softmax(x, axis=-1)
        ref = reference.softmax(cp.asnumpy(x[:2]).astype(np.float64), axis=-1)
        err = rel(y[:2], ref) if dname == "float32" else float(np.abs(cp.asnumpy(y[:2]).astype(np.float64) - ref).max())
        ms = bench.time_cuda(lambda: cuflash.softmax(x, axis=-1), warmup=3, rep=30)["median_ms"]
        rec("softmax", dname, n, ms, 2 * NBYTES, err)
        del x, y
    for dname, n in FWD:
        dt = getattr(_dtypes, dname)
        x = cp.random.standard_normal((NBYTES // (n * dt.itemsize), n), dtype=cp.float32).astype(dt)
        w = (1 + 0.1 * cp.random.standard_normal(n, dtype=cp.float32)).astype(dt)
        b = (0.1 * cp.random.standard_normal(n, dtype=cp.float32)).astype(dt)
        y = cuflash.layer_norm(x, (n,), w, b)
        h = x[:4].astype(cp.float64)
        m = h.mean(-1, keepdims=True)
        ref = (h - m) / cp.sqrt(((h - m) ** 2).mean(-1, keepdims=True) + 1e-5) * w.astype(cp.float64) + b.astype(
            cp.float64)
        err = float(cp.abs(y[:4].astype(cp.float64) - ref).max())
        ms = bench.time_cuda(lambda: cuflash.layer_norm(x, (n,), w, b), warmup=3, rep=30)["median_ms"]
        rec("fwd", dname, n, ms, 2 * NBYTES, err)
        del x, y
    for kind, dname, n in BWD:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (n * dt.itemsize)
        x = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dt)
        dy = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dt)
        w = (1 + 0.1 * cp.random.standard_normal(n, dtype=cp.float32)).astype(dt)
        if kind == "layer":
            _, mean, rstd = cuflash.layer_norm(x, (n,), w, None, return_stats=True)
            call = lambda: cuflash.layer_norm_backward(dy, x, w, mean, rstd)  # noqa: E731
            dx = call()[0]
            rdx = reference.layer_norm_backward(cp.asnumpy(dy[:2]), cp.asnumpy(x[:2]), cp.asnumpy(w),
                                                cp.asnumpy(mean[:2]), cp.asnumpy(rstd[:2]))[0]
        else:
            _, rstd = cuflash.rms_norm(x, (n,), w, return_stats=True)
            call = lambda: cuflash.rms_norm_backward(dy, x, w, rstd)  # noqa: E731
            dx = call()[0]
            rdx = reference.rms_norm_backward(cp.asnumpy(dy[:2]), cp.asnumpy(x[:2]), cp.asnumpy(w),
                                              cp.asnumpy(rstd[:2]))[0]
        err = float(np.abs(cp.asnumpy(dx[:2]).astype(np.float64) - rdx).max())
        ms = bench.time_cuda(call, warmup=3, rep=30)["median_ms"]
        rec(f"bwd_{kind}", dname, n, ms, 3 * NBYTES, err)
        del x, dy, dx
    bench.write_results(name, out, {"copy_GBps": copy})


if __name__ == "__main__":
    main(sys.argv[1])
