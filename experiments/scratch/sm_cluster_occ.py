"""Probe (#3, scratch): how many blocks of the softmax cluster kernel the H200 holds at once per cluster size, from
the driver (cuOccupancyMaxActiveClusters), for the cluster rows of the sweep (~256 MiB of input): a cluster's
blocks share a GPC, so C = 16 may leave SMs idle that C = 8 fills. Prints C, threads, dynamic shared bytes, the
resident clusters, their blocks and blocks a SM (against SMs x the blocks one SM holds by occupancy).
    PYTHONPATH=. python experiments/scratch/sm_cluster_occ.py"""
import importlib

import cupy as cp

import cuflash
from cuflash import _compile, _dtypes

sm = importlib.import_module("cuflash.softmax")  # the module (cuflash.softmax is the function)

sms = _compile.sm_count(0)
print("SMs", sms)
for dname, cols in [("float32", 32768), ("float32", 65536), ("float32", 131072), ("float32", 262144),
                    ("bfloat16", 65536), ("bfloat16", 131072), ("bfloat16", 262144), ("bfloat16", 524288)]:
    dt = getattr(_dtypes, dname)
    rows = (256 << 20) // (cols * cp.dtype(dt).itemsize)
    x = cp.random.standard_normal((rows, cols), dtype=cp.float32).astype(dt)
    sm._PREP.clear()
    cuflash.softmax(x, axis=-1)
    (pr,) = [p for p in sm._PREP.values() if p.plan is not None]
    pl = pr.plan
    if pl.path != "cluster":
        print(dname, cols, pl.path)
        continue
    c = pl.chunks
    kern = pr.kernels[0]
    n = _compile.max_active_clusters(kern, c, pr.block[0], pr.smem)
    print(f"{dname} {cols}: C={c} threads={pr.block[0]} smem={pr.smem >> 10}K clusters={n} blocks={n * c if n else None}"
          f" = {n * c / sms if n else 0:.2f} a SM; grid {pr.grid[0]} blocks = {pr.grid[0] / (n * c) if n else 0:.1f} waves")
    del x
