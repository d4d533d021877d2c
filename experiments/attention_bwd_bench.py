"""Attention backward speed: cuflash forward+backward against torch SDPA (FLASH and CUDNN backends), same run.

FlashAttention-2 benchmark convention (Dao 2023, Fig. 5-6): 16K tokens (batch = 16384 / seqlen), hidden 2048
(heads = 2048 / head_dim), head_dim 64 and 128, seqlen 512 ... 16K, causal and not, bfloat16 and float16.
FLOPs: forward F = 4·B·H·N²·d (halved when causal); backward alone 2.5·F; forward + backward 3.5·F.
The backward-alone time of torch is (forward+backward) − forward, both measured here.

Each speed sits beside errors, so a fast wrong kernel shows: ``dq_err`` is the max abs error of dq against a
float64 reference on 32 query rows × all heads of batch 0 (exact softmax of those rows), and ``d{q,k,v}_vs_flash``
the max abs difference from torch FLASH's gradients (torch FLASH's own dq error is given too).

Writes experiments/results/attention_bwd_bench.json|csv and plots/attention_bwd_tflops.png; a --quick run writes
attention_bwd_bench_quick.json|csv and plots/attention_bwd_bench_quick.png (another --name: <name>.json|csv and
plots/<name>.png). Without a GPU: one line, exit 2.

    python experiments/attention_bwd_bench.py            # full sweep
    python experiments/attention_bwd_bench.py --quick    # head_dim 128, seqlen 1K and 4K, bf16 (unless given)
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    add_shape_args, default_help, fill_defaults, half_to_torch, nonnegative_int, plot_tflops_grid, positive_int,
    run_names, sdpa_peers)

TOKENS, HIDDEN = 16384, 2048
FULL = {"seqlens": [512, 1024, 2048, 4096, 8192, 16384], "head_dims": [64, 128], "dtypes": ["bfloat16", "float16"],
        "rep": 30, "warmup": 5}
QUICK = {"seqlens": [1024, 4096], "head_dims": [128], "dtypes": ["bfloat16"], "rep": 20, "warmup": 3}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(ap, FULL["seqlens"])
    ap.set_defaults(seqlens=None, head_dims=None, dtypes=None)  # filled from FULL / QUICK below
    ap.add_argument("--deterministic", action="store_true", help="time the deterministic dQ path")
    ap.add_argument("--rep", type=positive_int, help=default_help("timed launches", "rep", FULL, QUICK))
    ap.add_argument("--warmup", type=nonnegative_int, help=default_help("untimed launches", "warmup", FULL, QUICK))
    ap.add_argument("--no-torch", action="store_true", help="skip the torch SDPA peers")
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --seqlens (1024 4096), --head-dims (128), --dtypes "
                         "(bfloat16), --rep (20) and --warmup (3), not what is given; writes attention_bwd_bench_quick "
                         "unless --name")
    ap.add_argument("--name", default=None,
                    help="results file stem (default attention_bwd_bench; attention_bwd_bench_quick with --quick); "
                         "the plot is plots/attention_bwd_tflops.png for attention_bwd_bench, else plots/<name>.png")
    a = fill_defaults(ap.parse_args(argv), FULL, QUICK)
    a.plot = run_names(a, "attention_bwd_bench", "attention_bwd_tflops")
    return a


def to_cupy(t):
    import cupy as cp
    from cuflash._dtypes import bfloat16

    t = t.detach().contiguous()
    if str(t.dtype) == "torch.bfloat16":
        import torch

        return cp.from_dlpack(t.view(torch.int16)).view(cp.uint16).view(bfloat16)
    return cp.from_dlpack(t)


def sample_dq_ref(q, k, v, do, causal, rows):
    """float64 dq for query ``rows`` of batch 0, all heads: (H, len(rows), d) (exact softmax of those rows)."""
    import cupy as cp

    f = lambda a: a.astype(cp.float32).astype(cp.float64)  # noqa: E731
    qs, dos = f(q[0][:, rows]), f(do[0][:, rows])
    kk, vv = f(k[0]), f(v[0])
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    s = cp.matmul(qs, kk.swapaxes(-1, -2)) * scale
    if causal:
        j = cp.arange(k.shape[2])[None, :]
        i = cp.asarray(rows)[:, None] + (k.shape[2] - q.shape[2])
        s = cp.where(j <= i, s, -cp.inf)
    s = s - s.max(-1, keepdims=True)
    p = cp.exp(s)
    p /= p.sum(-1, keepdims=True)
    dp = cp.matmul(dos, vv.swapaxes(-1, -2))
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    return cp.matmul(ds, kk) * scale


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from cuflash import bench

    if not bench.has_gpu():
        print("attention_bwd_bench: no CUDA device visible (run on the GPU machine)")
        return 2
    import cupy as cp
    from tqdm import tqdm

    import cuflash
    from cuflash._dtypes import bfloat16
    from cuflash import attention_bwd

    th = None if a.no_torch else sdpa_peers("attention_bwd_bench")
    combos = [(dn, d, n, m) for dn in a.dtypes for d in a.head_dims for n in a.seqlens for m in a.masks]
    rows = []
    rng = np.random.default_rng(0)
    for dn, d, n, mask in tqdm(combos, desc="attention bwd bench", unit="cfg"):
        dt = bfloat16 if dn == "bfloat16" else np.dtype(np.float16)
        causal = mask == "causal"
        B, H = max(TOKENS // n, 1), HIDDEN // d
        shape = (B, H, n, d)
        q, k, v, do = (cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt) for _ in range(4))
        F = 4.0 * B * H * n * n * d / (2 if causal else 1)
        sample = np.unique(np.linspace(0, n - 1, 32).astype(int))
        ref = sample_dq_ref(q, k, v, do, causal, sample)

        def dq_err(dq):
            return float(cp.abs(cp.asarray(dq)[0][:, sample].astype(cp.float32).astype(cp.float64) - ref).max())

        row = {"dtype": dn, "head_dim": d, "seqlen": n, "causal": causal, "batch": B, "heads": H,
               "deterministic": a.deterministic}
        fwd_ok = True
        try:
            out, lse = cuflash.attention(q, k, v, causal=causal, return_lse=True)
        except Exception as e:  # keep timing the backward if the forward is broken
            fwd_ok = False
            row["note"] = f"cuflash.attention failed ({e!r:.100}); backward timed on placeholder out/lse"
            out, lse = do.copy(), cp.zeros((B, H, n), dtype=cp.float32)

        def bwd():
            return cuflash.attention_backward(do, q, k, v, out, lse, causal=causal, deterministic=a.deterministic)

        def fwd_bwd():
            o, l = cuflash.attention(q, k, v, causal=causal, return_lse=True)
            return cuflash.attention_backward(do, q, k, v, o, l, causal=causal, deterministic=a.deterministic)

        ours = bwd()
        row["dq_err"] = dq_err(ours[0])
        t = bench.time_cuda(bwd, warmup=a.warmup, rep=a.rep)
        row["cuflash_bwd_ms"] = t["median_ms"]
        row["cuflash_bwd_tflops"] = 2.5 * F / (t["median_ms"] * 1e-3) / 1e12
        row["dkdv_kernel"] = "wgmma" if attention_bwd.uses_sm90_dkdv(dt, d, q.device.id) else "mma.sync"
        for bc in (64, 128) if d in (64, 128) else ():  # the mma.sync dK/dV kernel at both Bc, same run (the
            if row["dkdv_kernel"] == "mma.sync" and bc == attention_bwd.DEFAULT_BC[d]:  # default's is bwd itself)
                continue
            t = bench.time_cuda(lambda: cuflash.attention_backward(do, q, k, v, out, lse, causal=causal,
                                                                   deterministic=a.deterministic,
                                                                   block_sizes=(64, bc)),
                                warmup=a.warmup, rep=a.rep)
            row[f"cuflash_bwd_bc{bc}_tflops"] = 2.5 * F / (t["median_ms"] * 1e-3) / 1e12
        if not a.deterministic:  # the other dQ path, same run
            t = bench.time_cuda(lambda: cuflash.attention_backward(do, q, k, v, out, lse, causal=causal,
                                                                   deterministic=True), warmup=a.warmup, rep=a.rep)
            row["cuflash_bwd_det_tflops"] = 2.5 * F / (t["median_ms"] * 1e-3) / 1e12
        if fwd_ok:
            t = bench.time_cuda(fwd_bwd, warmup=a.warmup, rep=a.rep)
            row["cuflash_fwdbwd_ms"] = t["median_ms"]
            row["cuflash_fwdbwd_tflops"] = 3.5 * F / (t["median_ms"] * 1e-3) / 1e12
        if th is not None:
            torch, SDPBackend, sdpa_kernel = th
            sdpa = torch.nn.functional.scaled_dot_product_attention
            tq, tk, tv = (half_to_torch(torch, x, unsigned=True).requires_grad_() for x in (q, k, v))
            tdo = half_to_torch(torch, do, unsigned=True)
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                def tf():
                    with sdpa_kernel(backend):
                        return sdpa(tq, tk, tv, is_causal=causal)

                def tfb():
                    with sdpa_kernel(backend):
                        o = sdpa(tq, tk, tv, is_causal=causal)
                    return torch.autograd.grad(o, (tq, tk, tv), tdo)
                try:
                    grads = tfb()
                    torch.cuda.synchronize()
                    tt = bench.time_cuda(tfb, warmup=a.warmup, rep=a.rep)["median_ms"]
                    tfw = bench.time_cuda(tf, warmup=a.warmup, rep=a.rep)["median_ms"]
                    row[f"torch_{name}_fwdbwd_tflops"] = 3.5 * F / (tt * 1e-3) / 1e12
                    row[f"torch_{name}_bwd_tflops"] = 2.5 * F / (max(tt - tfw, 1e-6) * 1e-3) / 1e12
                    if fwd_ok:
                        row[f"ratio_fwdbwd_vs_{name}"] = (row["cuflash_fwdbwd_tflops"] /
                                                          row[f"torch_{name}_fwdbwd_tflops"])
                    if name == "flash":
                        gq, gk, gv = (to_cupy(g) for g in grads)
                        row["torch_flash_dq_err"] = dq_err(gq)
                        for gn, mine, theirs in (("dq", ours[0], gq), ("dk", ours[1], gk), ("dv", ours[2], gv)):
                            row[f"{gn}_vs_flash"] = float(cp.abs(mine.astype(cp.float32) -
                                                                 theirs.astype(cp.float32)).max())
                    del grads
                except Exception as e:
                    row[f"torch_{name}_fwdbwd_tflops"] = None
                    row[f"torch_{name}_note"] = repr(e)[:160]
            del tq, tk, tv, tdo
        rows.append(row)
        q = k = v = do = out = lse = ours = None  # free before the next shape
        cp.get_default_memory_pool().free_all_blocks()
    meta = {"what": "attention forward+backward and backward TFLOP/s, FlashAttention-2 convention "
                    "(16K tokens, hidden 2048)",
            "flops": "fwd F = 4*B*H*N^2*d (halved when causal); bwd 2.5 F; fwd+bwd 3.5 F",
            "timing": f"CUDA events, warmup {a.warmup}, median of {a.rep}; torch bwd = (fwd+bwd) - fwd",
            "error": "dq_err: max abs error vs float64 on 32 query rows x all heads of batch 0; *_vs_flash: max abs "
                     "difference from torch FLASH gradients",
            "peers": "torch SDPA under sdpa_kernel(FLASH_ATTENTION / CUDNN_ATTENTION), autograd.grad",
            "dq_path": "deterministic (separate dQ kernel)" if a.deterministic else "float32 atomicAdd",
            "kernels": "cuflash_bwd: the default (dkdv_kernel: wgmma on Hopper at head_dim 64 / 128, else mma.sync); "
                       "cuflash_bwd_bc64 / bc128: the mma.sync dK/dV kernel with block_sizes (64, Bc)"}
    path = bench.write_results(a.name, rows, meta)
    cols = ["dtype", "head_dim", "seqlen", "causal", "dkdv_kernel", "cuflash_fwdbwd_tflops", "cuflash_bwd_tflops",
            "cuflash_bwd_bc64_tflops", "cuflash_bwd_bc128_tflops", "cuflash_bwd_det_tflops", "dq_err",
            "torch_flash_fwdbwd_tflops", "torch_flash_bwd_tflops", "torch_flash_dq_err", "torch_cudnn_fwdbwd_tflops",
            "ratio_fwdbwd_vs_flash", "dk_vs_flash", "dv_vs_flash"]
    print(bench.table(rows, cols))
    plot(rows, bench.PLOTS / f"{a.plot}.png")
    print(f"wrote {path} and {bench.PLOTS / (a.plot + '.png')}")
    return 0


def plot(rows, path):
    plot_tflops_grid(rows, (("cuflash_fwdbwd_tflops", "C0", "cuflash fwd+bwd"), ("cuflash_bwd_tflops", "C3", "cuflash bwd"),
                            ("torch_flash_fwdbwd_tflops", "C1", "torch FLASH fwd+bwd"),
                            ("torch_cudnn_fwdbwd_tflops", "C2", "torch cuDNN fwd+bwd")),
                     path, "TFLOP/s (fwd+bwd: 3.5x fwd FLOPs, bwd: 2.5x)",
                     "attention forward + backward, 16K tokens, hidden 2048")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
