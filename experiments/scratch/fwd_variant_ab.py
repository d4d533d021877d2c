"""A/B of two Hopper forward variants (scratch): cuflash.attention (schedule auto) with _attention_sm90.DEFAULT_VARIANT
= A and = B (each with its default tile; or B = schedule "wgmma" with --b-blocks BR BC), interleaved per shape, torch SDPA cuDNN in the same run; FlashAttention-2
convention (16K tokens, hidden 2048), bfloat16. Writes experiments/results/<name>.json and prints the table.
    python experiments/scratch/fwd_variant_ab.py [--a tma] [--b tmap] [--name fwd_variant_ab] [--seqlens ...]
    [--b-blocks 192 64]
(A is the default tile, which is itself (192, 64) at head_dim 64 from LONG_SEQLEN_K keys when unmasked.)"""
import argparse, sys
sys.path.insert(0, ".")
sys.path.insert(0, "experiments")
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--name", default="fwd_variant_ab")
ap.add_argument("--a", default="tma")
ap.add_argument("--b", default="tmap")
ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 16384])
ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
ap.add_argument("--rep", type=int, default=30)
ap.add_argument("--b-blocks", type=int, nargs=2, default=None, metavar=("BR", "BC"),
                help="B = variant --b with block_sizes (BR, BC) (schedule 'wgmma') instead of its default tile")
ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
a = ap.parse_args()

import cupy as cp
import cuflash
from cuflash import bench, _attention_sm90 as S90
from _common import half_to_torch, sdpa_peers

th = sdpa_peers("fwd_variant_ab")
VAR = {0: a.a, 1: a.b if a.b_blocks is None else f"{a.b}_{a.b_blocks[0]}x{a.b_blocks[1]}"}
DT = {"bfloat16": cuflash.bfloat16, "float16": np.float16}[a.dtype]


def run(ab, q, k, v, causal):
    if ab == 1 and a.b_blocks is not None:
        S90.DEFAULT_VARIANT = a.b
        return cuflash.attention(q, k, v, causal=causal, schedule="wgmma", block_sizes=tuple(a.b_blocks))
    S90.DEFAULT_VARIANT = a.a if ab == 0 else a.b
    return cuflash.attention(q, k, v, causal=causal)


rng = np.random.default_rng(0)
rows = []
for d in a.head_dims:
    if a.b_blocks is not None and tuple(a.b_blocks) not in [c[:2] for c in S90.TILES[(a.b, d)]]:
        print(f"head_dim {d}: ({a.b_blocks[0]}, {a.b_blocks[1]}) is not a tile of {a.b}; skipped")
        continue
    for n in a.seqlens:
        for causal in (False, True):
            B, H = 16384 // n, 2048 // d
            q, k, v = (cp.asarray(rng.standard_normal((B, H, n, d), dtype=np.float32)).astype(DT)
                       for _ in range(3))
            F = 4.0 * B * H * n * n * d / (2 if causal else 1)
            row = {"head_dim": d, "seqlen": n, "causal": causal}
            outs = {}
            for rnd in range(2):  # A, B, A, B: the best median of each over both rounds
                for ab in (0, 1):
                    outs[ab] = run(ab, q, k, v, causal)
                    t = bench.time_cuda(lambda: run(ab, q, k, v, causal), warmup=3, rep=a.rep)
                    row.setdefault(f"ms_{VAR[ab]}", []).append(t["median_ms"])
            S90.DEFAULT_VARIANT = a.a
            for ab in (0, 1):
                row["tflops_" + "ab"[ab]] = F / (min(row[f"ms_{VAR[ab]}"]) * 1e-3) / 1e12
            row["bitwise_equal"] = bool(cp.array_equal(outs[0].view(cp.uint16), outs[1].view(cp.uint16)))
            row["b_over_a"] = row["tflops_b"] / row["tflops_a"]
            if th is not None:
                torch, SDPBackend, sdpa_kernel = th
                tq, tk, tv = (half_to_torch(torch, x, unsigned=True) for x in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    tt = bench.time_cuda(lambda: torch.nn.functional.scaled_dot_product_attention(
                        tq, tk, tv, is_causal=causal), warmup=3, rep=a.rep)["median_ms"]
                row["cudnn_tflops"] = F / (tt * 1e-3) / 1e12
                row["a_x_cudnn"] = row["tflops_a"] / row["cudnn_tflops"]
                row["b_x_cudnn"] = row["tflops_b"] / row["cudnn_tflops"]
                del tq, tk, tv
            rows.append(row)
            q = k = v = None
            outs.clear()
            cp.get_default_memory_pool().free_all_blocks()
path = bench.write_results(a.name, rows, {"what": f"Hopper forward, variant {a.a} (tflops_a) / {a.b} (tflops_b), "
                                                  f"interleaved, best of two medians each, cuDNN same run; {a.dtype}, 16K "
                                                  "tokens, hidden 2048; b_over_a = B / A",
                                          "timing": f"CUDA events, warmup 3, median of {a.rep}, two rounds"})
print(bench.table(rows, ["head_dim", "seqlen", "causal", "tflops_a", "tflops_b", "b_over_a", "bitwise_equal",
                         "cudnn_tflops", "a_x_cudnn", "b_x_cudnn"]))
print("wrote", path)
