"""Probe (#3, scratch): the cluster rows' speed against the distance from x to y (sm_mode2_probe: the same x ran
0.151 or 0.144 ms by where y was). One 1.5 GiB cudaMalloc; x at 0, y at D = 256 MiB + delta (and y before x); float32
32K (cluster C = 2), bfloat16 64K (C = 2), bfloat16 32K (block) and the copy x -> y, two rounds.
    PYTHONPATH=. python experiments/scratch/sm_dist_probe.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from _softmax_probe import NBYTES, bench, sm  # noqa: E402
from cuflash import _dtypes  # noqa: E402

MiB, KiB = 1 << 20, 1 << 10
mem = cp.cuda.Memory(1536 * MiB)
DELTAS = [0, 64 * KiB, 1 * MiB, 2 * MiB, 3 * MiB, 4 * MiB, 6 * MiB, 8 * MiB, 12 * MiB, 16 * MiB, 24 * MiB, 32 * MiB,
          64 * MiB, 128 * MiB, 256 * MiB, 384 * MiB + 6 * MiB]
SHAPES = [("float32", 32768), ("bfloat16", 65536), ("bfloat16", 32768)]
out = []


def view(off, dt, shape):
    return cp.ndarray(shape, dtype=dt, memptr=cp.cuda.MemoryPointer(mem, off))


for dname, cols in SHAPES:
    dt = getattr(_dtypes, dname)
    shp = (NBYTES // (cols * dt.itemsize), cols)
    view(0, dt, shp)[...] = cp.random.standard_normal(shp, dtype=cp.float32).astype(dt)
    view(1024 * MiB, dt, shp)[...] = view(0, dt, shp)
for rnd in range(2):
    for d in DELTAS:
        for xo, yo in ((0, 256 * MiB + d), (1024 * MiB, 1024 * MiB - 256 * MiB - d)):
            if yo + NBYTES > 1536 * MiB or yo < 0:
                continue
            xs, ys = view(xo, cp.uint8, (NBYTES,)), view(yo, cp.uint8, (NBYTES,))
            row = [rnd, (yo - xo) // KiB]
            row.append(bench.time_cuda(lambda: cp.copyto(ys, xs), warmup=3, rep=20)["median_ms"])
            for dname, cols in SHAPES:
                dt = getattr(_dtypes, dname)
                shp = (NBYTES // (cols * dt.itemsize), cols)
                x, y = view(xo, dt, shp), view(yo, dt, shp)
                # x at 1024 MiB holds the same data as at 0 (filled above; y never overlaps the x in use)
                pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
                row.append(bench.time_cuda(lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y), warmup=3,
                                           rep=20)["median_ms"])
            out.append(dict(round=rnd, D_KiB=row[1], copy_ms=row[2], **{f"{d}_{c}": v for (d, c), v in
                                                                       zip(SHAPES, row[3:])}))
            print("%d D=%9.3f MiB copy %.4f | f32 32K %.4f | bf16 64K %.4f | bf16 32K %.4f" %
                  (rnd, row[1] / 1024, *row[2:]), flush=True)
bench.write_results(f"sm_dist_probe_{bench.git_commit()[:7]}", out)
