"""Time one Hopper forward tile (scratch, for same-run A/Bs between source trees: run it in abm/ and here in turn):
cuflash.attention(schedule="wgmma", block_sizes=(BR, BC)) at head_dim 64 (or --head-dim), FlashAttention-2
convention (16K tokens, hidden 2048), causal and not; CUDA events, warmup 3, median of --rep.
    PYTHONPATH=. python experiments/scratch/fwd_tile_tree_ab.py --name NAME [--blocks 192 128] [--seqlens ...]"""
import argparse, sys
sys.path.insert(0, ".")
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--name", required=True)
ap.add_argument("--blocks", type=int, nargs=2, default=[192, 128])
ap.add_argument("--head-dim", type=int, default=64)
ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
ap.add_argument("--dtypes", nargs="+", default=["bfloat16"])
ap.add_argument("--rep", type=int, default=30)
a = ap.parse_args()

import cupy as cp
import cuflash
from cuflash import bench

rng = np.random.default_rng(0)
rows = []
d = a.head_dim
for dn in a.dtypes:
    dt = {"bfloat16": cuflash.bfloat16, "float16": np.float16}[dn]
    for n in a.seqlens:
        B, H = 16384 // n, 2048 // d
        q, k, v = (cp.asarray(rng.standard_normal((B, H, n, d), dtype=np.float32)).astype(dt) for _ in range(3))
        for causal in (False, True):
            f = lambda: cuflash.attention(q, k, v, causal=causal, schedule="wgmma", block_sizes=tuple(a.blocks))
            t = bench.time_cuda(f, warmup=3, rep=a.rep)["median_ms"]
            F = 4.0 * B * H * n * n * d / (2 if causal else 1)
            rows.append({"dtype": dn, "head_dim": d, "seqlen": n, "causal": causal, "ms": t, "tflops": F / (t * 1e-3) / 1e12})
        q = k = v = None
        cp.get_default_memory_pool().free_all_blocks()
bench.write_results(a.name, rows, {"what": f"cuflash.attention wgmma block_sizes {tuple(a.blocks)}", "timing": f"CUDA events, warmup 3, median of {a.rep}"})
print(bench.table(rows, ["dtype", "head_dim", "seqlen", "causal", "ms", "tflops"]))
