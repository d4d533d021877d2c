"""Probe (#3, scratch): is the cluster rows' slow mode (0.149-0.152 ms against 0.142-0.145, depending on what ran
before: sm_mode*_probe, sm_touch*_probe) the shared memory carveout the SMs are left in (fewer blocks an SM)? The
cluster kernel's preferred carveout toggled between the default (-1) and 100 (max shared memory), interleaved, each
on a fresh y; three rounds.
    PYTHONPATH=. python experiments/scratch/sm_carve_probe.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _softmax_probe import NBYTES, bench, fill_normal, own_array, sm  # noqa: E402
from cuflash import _dtypes  # noqa: E402

SHAPES = [("float32", 32768), ("bfloat16", 65536), ("float32", 65536), ("bfloat16", 131072), ("float32", 131072)]
out = []
for dname, cols in SHAPES:
    dt = getattr(_dtypes, dname)
    shp = (NBYTES // (cols * dt.itemsize), cols)
    x = fill_normal(own_array(dt, shp))
    pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
    k = pr.kernels[0]
    res = {}
    for rnd in range(3):
        for carve in (-1, 100, 50):
            try:
                k.preferred_shared_memory_carveout = carve
            except Exception as e:  # noqa: BLE001
                print("carveout", carve, "refused:", e)
                continue
            y = own_array(dt, shp)
            ms = bench.time_cuda(lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y), warmup=3, rep=30)["median_ms"]
            out.append(dict(round=rnd, carveout=carve, dtype=dname, cols=cols, C=pr.plan.chunks, ms=ms))
            res.setdefault(carve, []).append(ms)
            del y
    k.preferred_shared_memory_carveout = -1
    print(dname, cols, pr.plan.path, pr.plan.chunks, " | ".join(f"carveout {c}: {' '.join('%.4f' % m for m in ms)}"
                                                             for c, ms in res.items()), flush=True)
    del x
bench.write_results(f"sm_carve_probe_{bench.git_commit()[:7]}", out)
