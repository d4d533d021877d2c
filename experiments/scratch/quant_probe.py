"""Probe (scratch, #9): does the last, partly filled round of work tiles explain the head_dim 128 non-causal gap
to cuDNN? At the FlashAttention-2 convention (16K tokens, 16 heads) every head_dim 128 shape has 2048 Q tiles of
128 rows: 15.52 rounds of 132 SMs, the last one half empty. Here the (batch x heads) count is varied around it at
seqlen 2K and 4K (non-causal, bfloat16) so that the tiles fill 15.0-16.2 rounds; cuflash's default and cuDNN are
timed in rotated rounds (bench.time_rotated). If cuDNN's time follows the work and ours the rounds, the ratio
peaks at whole rounds. Writes experiments/results/quant_probe_<commit>.json.
    python experiments/scratch/quant_probe.py [--rounds 5]"""
import argparse, sys
sys.path.insert(0, ".")
sys.path.insert(0, "experiments")
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--rep", type=int, default=8)
a = ap.parse_args()

import cupy as cp
import cuflash
from cuflash import bench
from _common import half_to_torch, sdpa_peers

torch, SDPBackend, sdpa_kernel = sdpa_peers("quant_probe")
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
d = 128
shapes = [(2048, 8, 16)] + [(2048, 1, h) for h in (120, 124, 128, 130, 132, 133, 136)] + \
         [(4096, 4, 16)] + [(4096, 1, h) for h in (62, 64, 65, 66, 67)]
rows = []
for n, B, H in shapes:
    q, k, v = (cp.random.standard_normal((B, H, n, d), dtype=cp.float32).astype(cuflash.bfloat16) for _ in range(3))
    tq, tk, tv = (half_to_torch(torch, x, unsigned=True) for x in (q, k, v))

    def fc():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    res = bench.time_rotated({"cuflash": lambda: cuflash.attention(q, k, v), "cudnn": fc}, rounds=a.rounds,
                             rep=a.rep)
    F = 4.0 * B * H * n * n * d
    tiles = B * H * (n // 128)
    row = {"seqlen": n, "batch": B, "heads": H, "tiles": tiles, "rounds": tiles / SMS,
           "ms_cuflash": res["cuflash"]["median_ms"], "ms_cudnn": res["cudnn"]["median_ms"],
           "tflops_cuflash": F / res["cuflash"]["median_ms"] / 1e9, "tflops_cudnn": F / res["cudnn"]["median_ms"] / 1e9,
           "x_cudnn": float(np.median(np.asarray(res["cudnn"]["rounds_ms"]) / np.asarray(res["cuflash"]["rounds_ms"])))}
    rows.append(row)
    print(" | ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    q = k = v = tq = tk = tv = None
    cp.get_default_memory_pool().free_all_blocks()
print("wrote", bench.write_results("quant_probe", rows, {"what": "head_dim 128 non-causal bf16, cuflash default vs "
                                   f"cuDNN by tile rounds, {a.rounds} rotated rounds x {a.rep}"}))
