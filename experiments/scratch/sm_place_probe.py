"""Probe (#3, scratch): does where x and y lie in memory move the softmax's rate? One 1.5 GiB buffer; x and y
(256 MiB each) placed at several offsets in it; softmax (automatic plan, launched by the wrapper's own _prepare /
_exec into the placed y) and the device copy x -> y at each placement, two rounds. Writes
experiments/results/sm_place_probe_<commit>.json.
    PYTHONPATH=. python experiments/scratch/sm_place_probe.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from _softmax_probe import NBYTES, bench, frac, sm  # noqa: E402
from cuflash import _dtypes  # noqa: E402

MiB, KiB = 1 << 20, 1 << 10
PLACES = [(0, 512 * MiB), (0, 512 * MiB + 64 * KiB), (0, 512 * MiB + 1 * MiB), (64 * KiB, 512 * MiB),
          (0, 256 * MiB), (32 * MiB + 8 * KiB, 768 * MiB + 40 * KiB), (1024 * MiB, 0), (300 * MiB + 4 * KiB, 700 * MiB)]
SHAPES = [("float32", 32768), ("bfloat16", 32768), ("bfloat16", 65536), ("float32", 131072), ("bfloat16", 16384)]
buf = cp.empty(1536 * MiB, dtype=cp.uint8)
out = []
for rnd in range(2):
    for px, py in PLACES:
        xs, ys = buf[px:px + NBYTES], buf[py:py + NBYTES]
        ms = bench.time_cuda(lambda: cp.copyto(ys, xs), warmup=3, rep=30)["median_ms"]
        copy = 2 * NBYTES / (ms * 1e-3) / 1e9
        out.append(dict(round=rnd, place=[px, py], impl="copy", ms=ms))
        for dname, cols in SHAPES:
            dt = getattr(_dtypes, dname)
            rows = NBYTES // (cols * dt.itemsize)
            x = xs.view(dt).reshape(rows, cols)
            y = ys.view(dt).reshape(rows, cols)
            x[...] = cp.random.standard_normal((rows, cols), dtype=cp.float32).astype(dt)
            pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
            fn = lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y)  # noqa: E731
            m2 = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
            f = frac(rows, cols, dt, m2, copy)
            out.append(dict(round=rnd, place=[px, py], impl="cuflash", dtype=dname, cols=cols, path=pr.plan.path,
                            C=pr.plan.chunks, ms=m2, frac_of_copy=f, copy_ms=ms))
            print(rnd, px // KiB, py // KiB, "copy %.4f" % ms, dname, cols, pr.plan.path, pr.plan.chunks,
                  "%.4f ms %.3f" % (m2, f), flush=True)
bench.write_results(f"sm_place_probe_{bench.git_commit()[:7]}", out)
