"""Same-run A/B of norm_fwd_stream's copy issue (branch-free cp.async, zero-fill past the last row) against main's
tree (run in both, interleaved: experiments/scratch/ln_issue_call.sh), at STREAM_STAGES 2 and 3. One run: plain
LayerNorm with weight and bias at 256 MiB of x for each (dtype, hidden) on the streamed path, CUDA events (3
warm-ups, median of 30), the 1 GiB copy of the same run, max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/ln_issue_ab.py NAME"""
import sys

import cupy as cp

from cuflash import _dtypes, bench, norm as nm

NBYTES = 256 << 20
SHAPES = [("bfloat16", 32768), ("float32", 16384), ("float16", 32768)]


def main(name):
    copy = bench.copy_bandwidth(1 << 30)
    out = []
    for dname, hidden in SHAPES:
        dt = getattr(_dtypes, dname)
        rows = NBYTES // (hidden * dt.itemsize)
        x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
        w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
        sel = cp.linspace(0, rows - 1, 256).astype(cp.int64)
        h64 = x[sel].astype(cp.float64)
        m64 = h64.mean(-1, keepdims=True)
        y64 = (h64 - m64) / cp.sqrt(((h64 - m64) ** 2).mean(-1, keepdims=True) + 1e-5) * w.astype(cp.float64) \
            + b.astype(cp.float64)
        for stages in (2, 3):
            nm.STREAM_STAGES = stages
            pl = nm._fwd_config(nm.LAYER, x.dtype, w.dtype, hidden, False, x.device.id)
            assert pl.stream, (dname, hidden)
            y = nm.layer_norm(x, (hidden,), w, b)
            err = float(cp.abs(y[sel].astype(cp.float64) - y64).max())
            ms = bench.time_cuda(lambda: nm.layer_norm(x, (hidden,), w, b), warmup=3, rep=30)["median_ms"]
            f = 2 * NBYTES / (ms * 1e-3) / 1e9 / copy
            out.append(dict(dtype=dname, hidden=hidden, stages=stages, ms=ms, frac_copy=f, max_abs_err=err))
            print(f"{dname} {hidden} stages {stages}: {f:.3f} of copy ({ms * 1e3:.1f} us), err {err:.2g}", flush=True)
        del x, y
    bench.write_results(name, out, {"copy_GBps": copy})


if __name__ == "__main__":
    main(sys.argv[1])
