"""Attention forward speed: cuflash's FA-2 kernel against torch SDPA (FLASH and CUDNN backends), same run.

The FlashAttention-2 benchmark convention (Dao 2023, Fig. 5-6): 16K tokens in total (batch = 16384 / seqlen),
hidden 2048 (heads = 2048 / head_dim), head_dim 64 and 128, seqlen 512 ... 16K, causal and not, bfloat16 and
float16. TFLOP/s = 4·B·H·N²·d / t, halved when causal. Each speed sits beside its max abs error against a
float64 reference computed on a sample of query rows (all heads of batch 0), so a fast wrong kernel shows.

Writes experiments/results/attention_bench.json|csv and plots/attention_tflops.png; a --quick run writes
attention_bench_quick.json|csv and plots/attention_bench_quick.png (another --name: <name>.json|csv and
plots/<name>.png). Without a GPU: one line, exit 2.

    python experiments/attention_bench.py            # full sweep
    python experiments/attention_bench.py --quick    # seqlen 1K and 4K, bf16 only (unless given)
    python experiments/attention_bench.py --replot   # redraw plots/attention_tflops.png from the results JSON
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    add_replot_arg, add_shape_args, default_help, fill_defaults, half_to_torch as to_torch, load_results,
    nonnegative_int, positive_int, pyplot, run_names, sample_ref, save_figure, sdpa_peers)

TOKENS, HIDDEN = 16384, 2048
ROUNDS = 5  # rotated timing rounds per configuration (bench.time_rotated); --rep launches in all
FULL = {"seqlens": [512, 1024, 2048, 4096, 8192, 16384], "dtypes": ["bfloat16", "float16"], "rep": 30,
        "warmup": 5}
QUICK = {"seqlens": [1024, 4096], "dtypes": ["bfloat16"], "rep": 20, "warmup": 3}


def per_round(rep):
    """Launches per contender and timing round: --rep spread over ROUNDS rounds, at least 4 a round."""
    return max(4, rep // ROUNDS)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(ap, FULL["seqlens"])
    ap.set_defaults(seqlens=None, dtypes=None)  # filled from FULL / QUICK below
    ap.add_argument("--rep", type=positive_int,
                    help=default_help(f"timed launches per contender, in {ROUNDS} rounds of at least 4", "rep",
                                      FULL, QUICK))
    ap.add_argument("--warmup", type=nonnegative_int, help=default_help("untimed launches", "warmup", FULL, QUICK))
    ap.add_argument("--no-torch", action="store_true", help="skip the torch SDPA peers")
    ap.add_argument("--no-wgmma", action="store_true", help="skip the Hopper wgmma schedule column")
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --seqlens (1024 4096), --dtypes (bfloat16), --rep (20) "
                         "and --warmup (3), not what is given; writes attention_bench_quick unless --name")
    ap.add_argument("--name", default=None,
                    help="results file stem (default attention_bench; attention_bench_quick with --quick); the "
                         "plot is plots/attention_tflops.png for attention_bench, else plots/<name>.png")
    add_replot_arg(ap, "attention_bench")
    a = fill_defaults(ap.parse_args(argv), FULL, QUICK)
    a.plot = run_names(a, "attention_bench", "attention_tflops")
    return a


def host_overhead(A, th, bfloat16) -> dict:
    """Microseconds of host work per call (bench.host_us_per_call) at a shape the GPU runs faster than the
    launches come (batch 1, 4 heads, seqlen 128, head_dim 64, bfloat16, causal), per implementation."""
    import cupy as cp

    from cuflash import bench

    q, k, v = (cp.random.standard_normal((1, 4, 128, 64), dtype=cp.float32).astype(bfloat16) for _ in range(3))
    fns = {"cuflash.attention (auto)": lambda: A.attention(q, k, v, causal=True),
           "cuflash.attention fa2": lambda: A.attention(q, k, v, causal=True, schedule="fa2")}
    if th is not None:
        torch, SDPBackend, sdpa_kernel = th
        tq, tk, tv = (to_torch(torch, x) for x in (q, k, v))
        fns["torch sdpa (default backend)"] = lambda: torch.nn.functional.scaled_dot_product_attention(
            tq, tk, tv, is_causal=True)
    out = {}
    for name, f in fns.items():
        try:
            out[name] = bench.host_us_per_call(f)
        except Exception as e:  # a peer that does not run here
            out[name] = repr(e)[:120]
    return out


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from cuflash import bench

    if a.replot:
        plot(load_results(a.name)["rows"], bench.PLOTS / f"{a.plot}.png")
        print("wrote", bench.PLOTS / f"{a.plot}.png")
        return 0
    if not bench.has_gpu():
        print("attention_bench: no CUDA device visible (run on the GPU machine)")
        return 2
    import cupy as cp
    from tqdm import tqdm
    A = importlib.import_module("cuflash.attention")
    from cuflash import _attention_sm90 as S90
    from cuflash._attn_common import prepare
    from cuflash._dtypes import bfloat16

    th = None if a.no_torch else sdpa_peers("attention_bench")
    combos = [(dn, d, n, m) for dn in a.dtypes for d in a.head_dims for n in a.seqlens for m in a.masks]
    rows = []
    rng = cp.random.default_rng(0)  # on the device: 16K tokens x hidden 2048 x 3 per configuration
    for dn, d, n, mask in tqdm(combos, desc="attention bench", unit="cfg"):
        dt = {"bfloat16": bfloat16, "float16": np.dtype(np.float16)}[dn]  # the names parse_args accepts
        causal = mask == "causal"
        B, H = max(TOKENS // n, 1), HIDDEN // d
        shape = (B, H, n, d)
        q, k, v = (rng.standard_normal(shape, dtype=np.float32).astype(dt) for _ in range(3))
        fl = A.flops(B, H, n, n, d, causal)
        sample = np.unique(np.linspace(0, n - 1, 48).astype(int))
        ref = sample_ref(q, k, v, causal, sample)

        def err(out):
            o = cp.asarray(out)[0][:, sample].astype(cp.float64)
            return float(cp.abs(o - ref).max())

        row = {"dtype": dn, "head_dim": d, "seqlen": n, "causal": causal, "batch": B, "heads": H,
               "tiles": "{}x{}/{}w".format(*A.DEFAULT_TILES[(d, causal)])}
        # the contenders, checked once each, then timed in rotated rounds (bench.time_rotated)
        fns = {"cuflash": lambda: A.attention(q, k, v, causal=causal, schedule="fa2")}
        row["cuflash_err"] = err(fns["cuflash"]())
        if not a.no_wgmma:  # the Hopper wgmma kernel (cuflash._attention_sm90), when it runs here
            try:
                fns["wgmma"] = lambda: A.attention(q, k, v, causal=causal, schedule="wgmma")
                row["wgmma_err"] = err(fns["wgmma"]())
                # the variant and tile it ran ("auto": tmap or tma by shape)
                row["wgmma_config"] = "{} {}x{} pv_n {}".format(*S90.choose(prepare(q, k, v, causal=causal)))
            except Exception as e:
                fns.pop("wgmma")
                row["wgmma_tflops"] = None
                row["wgmma_note"] = repr(e)[:120]
        if th is not None:
            torch, SDPBackend, sdpa_kernel = th
            tq, tk, tv = (to_torch(torch, x) for x in (q, k, v))
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                def tfn(backend=backend):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                try:
                    out = tfn()
                    torch.cuda.synchronize()
                    o = out.contiguous()
                    o = cp.from_dlpack(o.view(torch.int16) if o.dtype == torch.bfloat16 else o)
                    row[f"torch_{name}_err"] = err(o.view(cp.uint16).view(bfloat16) if dn == "bfloat16" else o)
                    fns[f"torch_{name}"] = tfn
                except Exception as e:
                    row[f"torch_{name}_tflops"] = None
                    row[f"torch_{name}_note"] = repr(e)[:120]
        times = bench.time_rotated(fns, rounds=ROUNDS, warmup=a.warmup, rep=per_round(a.rep))
        for nm, t in times.items():
            row[f"{nm}_ms"] = t["median_ms"]
            row[f"{nm}_tflops"] = fl / (t["median_ms"] * 1e-3) / 1e12
        for peer in ("flash", "cudnn"):
            if row.get(f"torch_{peer}_tflops"):
                row[f"ratio_vs_{peer}"] = row["cuflash_tflops"] / row[f"torch_{peer}_tflops"]
                if row.get("wgmma_tflops"):
                    row[f"wgmma_ratio_vs_{peer}"] = row["wgmma_tflops"] / row[f"torch_{peer}_tflops"]
        fns.clear()
        if th is not None:
            del tq, tk, tv
        rows.append(row)
        q = k = v = ref = None  # free before the next size
        cp.get_default_memory_pool().free_all_blocks()
    meta = {"host_overhead_us": host_overhead(A, th, bfloat16),
            "what": "attention forward TFLOP/s, FlashAttention-2 convention (16K tokens, hidden 2048)",
            "flops": "4*B*H*N^2*d / t, halved when causal",
            "timing": f"CUDA events, warmup {a.warmup}; {ROUNDS} rounds of {per_round(a.rep)} launches per "
                      "contender in a rotated order (bench.time_rotated), median of the round medians",
            "error": "max abs error vs float64 reference on 48 query rows x all heads of batch 0",
            "peers": "torch.nn.functional.scaled_dot_product_attention under "
                     "sdpa_kernel(FLASH_ATTENTION / CUDNN_ATTENTION)"}
    path = bench.write_results(a.name, rows, meta)
    cols = ["dtype", "head_dim", "seqlen", "causal", "cuflash_tflops", "cuflash_err", "torch_flash_tflops",
            "torch_flash_err", "torch_cudnn_tflops", "torch_cudnn_err", "ratio_vs_flash", "wgmma_tflops",
            "wgmma_err", "wgmma_ratio_vs_cudnn"]
    print(bench.table(rows, cols))
    plot(rows, bench.PLOTS / f"{a.plot}.png")
    print(f"wrote {path} and {bench.PLOTS / (a.plot + '.png')}")
    return 0


IMPLS = (("cuflash_tflops", "C0", "cuflash FA-2"), ("wgmma_tflops", "C3", "cuflash wgmma"),
         ("torch_flash_tflops", "C1", "torch FLASH"), ("torch_cudnn_tflops", "C2", "torch cuDNN"))
DTYPE_LS = (("bfloat16", "-"), ("float16", (0, (5, 2.5))))


def plot(rows, path):
    """TFLOP/s against seqlen, one panel per (mask, head_dim): colour = implementation, line style = dtype;
    one figure legend in two parts (implementation colours, dtype line styles drawn with long handles)."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    dims = sorted({r["head_dim"] for r in rows})
    masks = sorted({r["causal"] for r in rows})
    fig, axes = plt.subplots(len(masks), len(dims), figsize=(5.5 * len(dims), 4 * len(masks) + 0.6),
                             squeeze=False)
    seen_impl, seen_dt = [], []
    for i, causal in enumerate(masks):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            for dn, ls in DTYPE_LS:
                rs = sorted([r for r in rows if r["head_dim"] == d and r["causal"] == causal and r["dtype"] == dn],
                            key=lambda r: r["seqlen"])
                if not rs:
                    continue
                for key, c, lab in IMPLS:
                    pts = [(r["seqlen"], r[key]) for r in rs if r.get(key)]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, color=c, marker="o", ms=3,
                                lw=1.4)
                        seen_impl += [] if key in seen_impl else [key]
                        seen_dt += [] if dn in seen_dt else [dn]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.set_title(f"head_dim {d}, {'causal' if causal else 'no mask'}", fontsize=9)
            ax.grid(alpha=0.3)
    h_impl = [Line2D([], [], color=c, lw=2.5, label=lab) for key, c, lab in IMPLS if key in seen_impl]
    h_dt = [Line2D([], [], color="0.25", ls=ls, lw=1.6, label=dn) for dn, ls in DTYPE_LS if dn in seen_dt]
    bottom = 0.6 / (4 * len(masks) + 0.6)
    leg = fig.legend(handles=h_impl, title="implementation (colour)", loc="lower center", ncol=len(h_impl),
                     fontsize=8, title_fontsize=8, bbox_to_anchor=(0.36, 0.0), frameon=False)
    fig.add_artist(leg)
    fig.legend(handles=h_dt, title="dtype (line style)", loc="lower center", ncol=len(h_dt), fontsize=8,
               title_fontsize=8, bbox_to_anchor=(0.82, 0.0), handlelength=4.5, frameon=False)
    fig.suptitle("attention forward, 16K tokens, hidden 2048", fontsize=10)
    save_figure(fig, path, rect=(0, bottom, 1, 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
