"""The FlashAttention paper's Figure 2 on this GPU (Dao et al. 2022, Fig. 2).

(a) Standard vs tiled attention at the GPT-2 medium shape (batch 64, 16 heads, seqlen 1024, head_dim 64,
    float16): GFLOPs, HBM GB and runtime side by side, for cuflash's three schedules (standard: S and P in HBM;
    fa1: K/V tiles outermost, O/m/l round trips; fa2) and torch SDPA's MATH / FLASH / CUDNN backends measured in
    the same run. The paper (A100, forward + backward): standard 66.6 GFLOPs, 40.3 GB, 41.7 ms; FlashAttention
    75.2 GFLOPs, 4.4 GB, 7.3 ms.
(b) Block size sweep of the FA-1 schedule (Br = 64, Bc = 16 .. 256): HBM traffic falls as the block grows
    (Theta(N^2 d / Bc)), runtime falls then flattens.

HBM GB are the traffic model (``cuflash.traffic.attention_bytes``) and, when Nsight Compute is present, the
measured DRAM bytes (``cuflash.ncu``: dram__bytes_read.sum + dram__bytes_write.sum, clocks left alone) with their
ratio; a ratio off by more than 10% is flagged in ``model_note``. Without a GPU (or with ``--predict``) every
number is the model with roofline-predicted times for ``--gpu`` (``cuflash.gpus``), written to
``fig2_predicted.json`` and labelled PREDICTED (without a GPU and without ``--predict``: to ``--out`` or a new
temporary folder, never over the committed file). A ``--quick`` run writes ``fig2_quick.json`` /
``fig2_quick_predicted.json`` (and their plots) unless ``--name`` is given.

Error columns (measured rows; batch 0, heads 0-1 against the float64 reference): ``max_abs_err`` = max|out - ref|,
``max_rel_err`` = max|out - ref| / max|ref| (norm-wise: an element-wise ratio divides by near-zero reference
entries and reads 50-80 for a correct kernel), ``mean_abs_err``, and ``out_rounding_abs_err`` = max|round(ref) -
ref| with round() to the output dtype: the floor every implementation shares (with a float16 output the max abs
error is usually this rounding, identical for all implementations; mean_abs_err still tells them apart); beside
``fwdbwd_ms``, ``bwd_max_abs_err`` = the max over dq, dk, dv of max|g - ref| and ``bwd_max_rel_err`` = that over
the largest reference gradient (one backward from zero gradients, same slice).

    python experiments/fig2.py [--quick] [--predict] [--gpu H200] [--ncu auto|on|off] [--out DIR]
    python experiments/fig2.py --replot [--predict] [--out DIR]
        # redraw plots/fig2.png (fig2_predicted.png) from experiments/results/fig2.json (fig2_predicted.json),
        # into DIR/plots with --out
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    add_replot_arg, default_help, fill_defaults, from_torch, int_list, nonnegative_int, output_dirs, positive_int,
    predicted_mode, predicted_watermark, print_results, pyplot, replot_recorded, run_names, save_figure,
    scratch_out, to_torch)

import numpy as np  # noqa: E402

from cuflash import bench, gpus, ncu, traffic  # noqa: E402

PAPER_A100_FWDBWD = {"standard": {"GFLOPs": 66.6, "HBM_GB": 40.3, "ms": 41.7},
                     "flashattention": {"GFLOPs": 75.2, "HBM_GB": 4.4, "ms": 7.3}}
ANCHOR_H200_FWDBWD = {"MATH": {"fwd_ms": 16.76, "fwdbwd_ms": 36.94, "HBM_GB": 89.85},
                      "FLASH_ATTENTION": {"fwd_ms": 0.97, "fwdbwd_ms": 4.35, "HBM_GB": 3.27},
                      "CUDNN_ATTENTION": {"fwd_ms": 0.67, "fwdbwd_ms": 2.86, "HBM_GB": 2.77}}
FA2_TILES = (128, 64)   # FA-2 model tiles for torch FLASH/CUDNN and cuflash fa2 (head_dim 64 default)


FULL, QUICK = {"batch": 64}, {"batch": 4}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=positive_int, help=default_help("batch", "batch", FULL, QUICK))
    ap.add_argument("--heads", type=positive_int, default=16)
    ap.add_argument("--seqlen", type=positive_int, default=1024)
    ap.add_argument("--head-dim", type=positive_int, default=64)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--block-sizes", type=int_list, default="16,32,64,128,256",
                    help="Bc values of the fa1 sweep (Br = 64)")
    ap.add_argument("--rep", type=positive_int, default=20)
    ap.add_argument("--warmup", type=nonnegative_int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: batch 4 unless --batch, no ncu unless --ncu on; writes fig2_quick "
                         "(fig2_quick_predicted) unless --name")
    ap.add_argument("--name", default=None,
                    help="results and plot file stem (default fig2; fig2_quick with --quick); _predicted is "
                         "appended for the model-only run")
    ap.add_argument("--predict", action="store_true", help="model only (no GPU use): roofline-predicted times")
    ap.add_argument("--gpu", default="H200", help="GPU table entry for predicted times (H200, H100, A100)")
    ap.add_argument("--ncu", default="auto", choices=["auto", "on", "off"],
                    help="measure DRAM bytes with Nsight Compute (auto: when ncu exists and not --quick)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch SDPA peers")
    ap.add_argument("--out", default=None, help="results folder (default experiments/results); plots go to "
                                                "OUT/plots unless --plots")
    ap.add_argument("--plots", default=None)
    add_replot_arg(ap, "fig2 (with --predict: fig2_predicted)", out=True)
    a = fill_defaults(ap.parse_args(argv), FULL, QUICK)
    run_names(a, "fig2", "fig2")
    return a


def model_rows(a):
    """(impl, schedule, model kwargs, tensor cores) of every row of Fig. 2a."""
    return [
        ("cuflash standard", "standard", dict(score_dtype="float32"), False),
        ("cuflash fa1", "fa1", dict(Br=64, Bc=64), False),
        ("cuflash fa2", "fa2", dict(Br=FA2_TILES[0], Bc=FA2_TILES[1]), True),
        ("torch MATH", "standard", dict(score_dtype=a.dtype), True),
        ("torch FLASH", "fa2", dict(Br=128, Bc=64), True),
        ("torch CUDNN", "fa2", dict(Br=128, Bc=64), True),
    ]


def modeled(a, schedule, kw):
    kw = dict(kw)
    br, bc = kw.pop("Br", None), kw.pop("Bc", None)
    return traffic.attention_bytes(schedule, a.batch, a.heads, a.seqlen, a.seqlen, a.head_dim, br, bc, a.dtype,
                                   False, **kw)


def base_row(a, fig, impl, schedule, nbytes, mode):
    fl = traffic.attention_flops(a.batch, a.heads, a.seqlen, a.seqlen, a.head_dim)
    return {"figure": fig, "impl": impl, "schedule": schedule, "mode": mode,
            "shape": f"B{a.batch} H{a.heads} N{a.seqlen} d{a.head_dim}", "dtype": a.dtype,
            "gflops_fwd": fl / 1e9, "hbm_gb_model": nbytes / 1e9}


# ----------------------------------------------------------------------------------------------------------
def run_predicted(a, plots):
    g = gpus.get(a.gpu)
    rows = []
    fl = traffic.attention_flops(a.batch, a.heads, a.seqlen, a.seqlen, a.head_dim)
    for impl, sched, kw, tc in model_rows(a):
        nb = modeled(a, sched, kw)
        r = base_row(a, "2a", impl, sched, nb, "predicted")
        dt = a.dtype if tc else "float32"
        r["fwd_ms"] = gpus.predict_time_s(nb, fl, g, dt, tensor_cores=tc) * 1e3
        r["tflops_fwd"] = fl / (r["fwd_ms"] * 1e-3) / 1e12
        r["predicted_for"] = g.name
        rows.append(r)
    for bc in [int(x) for x in a.block_sizes.split(",")]:
        nb = traffic.attention_bytes("fa1", a.batch, a.heads, a.seqlen, a.seqlen, a.head_dim, 64, bc, a.dtype, False)
        r = base_row(a, "2b", "cuflash fa1", "fa1", nb, "predicted")
        r.update(Br=64, Bc=bc, fwd_ms=gpus.predict_time_s(nb, fl, g, "float32", tensor_cores=False) * 1e3,
                 predicted_for=g.name)
        rows.append(r)
    meta = {"predicted": True, "gpu_table": g.name, "gpu_notes": g.notes, "paper_A100_fwdbwd": PAPER_A100_FWDBWD,
            "anchor_H200_fwdbwd": ANCHOR_H200_FWDBWD, "args": vars(a),
            "note": "PREDICTED: traffic model + roofline (max(bytes/copy BW, flops/peak)); no GPU measurement"}
    path = bench.write_results(f"{a.name}_predicted", rows, meta)
    plot(rows, plots / f"{a.name}_predicted.png", f"PREDICTED for {g.name} (roofline model, no GPU)")
    return path, rows


# ----------------------------------------------------------------------------------------------------------
def _torch():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if not torch.cuda.is_available():
            return None
        return torch, SDPBackend, sdpa_kernel
    except Exception as e:  # torch missing: peers skipped
        print(f"fig2: torch peers skipped ({type(e).__name__}: {e})")
        return None


def _setup_code(a):
    return (f"import numpy as np, cuflash\nfrom cuflash._attention_alt import from_float32\n"
            f"rs = cupy.random.RandomState(0)\n"
            f"q, k, v = (from_float32(rs.standard_normal(({a.batch}, {a.heads}, {a.seqlen}, {a.head_dim}), "
            f"dtype=cupy.float32), cuflash._dtypes.{a.dtype}) for _ in range(3))\n")


def _torch_setup(a, backend):
    return (f"import torch\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n"
            f"dt = getattr(torch, {a.dtype!r})\n"
            f"q, k, v = (torch.randn({a.batch}, {a.heads}, {a.seqlen}, {a.head_dim}, device='cuda', dtype=dt) "
            f"for _ in range(3))\nBE = SDPBackend.{backend}\n")


def run_measured(a, plots):
    import cupy as cp
    from tqdm import tqdm

    import cuflash
    from cuflash import reference

    use_ncu = a.ncu == "on" or (a.ncu == "auto" and not a.quick and ncu.available())
    if use_ncu and not ncu.available():
        print("fig2: --ncu on but ncu is not available; measured bytes skipped")
        use_ncu = False
    env = bench.environment()
    dt = cuflash.bfloat16 if a.dtype == "bfloat16" else np.float16
    rs = cp.random.RandomState(0)
    shape = (a.batch, a.heads, a.seqlen, a.head_dim)
    from cuflash._attention_alt import from_float32

    q, k, v = (from_float32(rs.standard_normal(shape, dtype=cp.float32), dt) for _ in range(3))
    dout = from_float32(rs.standard_normal(shape, dtype=cp.float32), dt)
    l2 = env.get("l2_bytes") or 60 * 2**20
    flush = 3 * q.nbytes < 2 * l2
    # reference on a slice (batch 0, heads 0-1) for the error columns
    qs, ks, vs = (x[:1, :2].get() for x in (q, k, v))
    ref, _ = reference.attention(qs, ks, vs)
    ref_max = float(np.abs(ref).max())
    # the floor every implementation shares: the exact output rounded to the output dtype
    out_rounding = float(np.abs(ref.astype(np.dtype(dt)).astype(np.float64) - ref).max())

    gref = reference.attention_backward(dout[:1, :2].get(), qs, ks, vs)  # dq, dk, dv of the same slice
    gref_max = max(float(np.abs(g).max()) for g in gref)

    def bwd_err(grads):
        """The backward's errors on the slice: the max over dq, dk, dv of max|g - ref| (``bwd_max_abs_err``) and
        that over the largest reference gradient (``bwd_max_rel_err``, norm-wise as the forward's)."""
        e = max(bench.errors(g[:1, :2], r)["max_abs_err"] for g, r in zip(grads, gref))
        return {"bwd_max_abs_err": e, "bwd_max_rel_err": e / gref_max}

    def err(out):
        """Errors of THIS output (batch 0, heads 0-1); relative error norm-wise: max|out-ref| / max|ref|
        (bench.errors' element-wise ratio divides by near-zero reference entries)."""
        e = bench.errors(out[:1, :2], ref)
        return {"max_abs_err": e["max_abs_err"], "max_rel_err": e["max_abs_err"] / ref_max,
                "mean_abs_err": e["mean_abs_err"], "out_rounding_abs_err": out_rounding,
                "nonfinite_mismatch": e["nonfinite_mismatch"]}

    th = None if a.no_torch else _torch()
    jobs = [("cuflash standard", "standard", None), ("cuflash fa1", "fa1", (64, 64)), ("cuflash fa2", "fa2", None)]
    if th:
        jobs += [("torch MATH", "MATH", None), ("torch FLASH", "FLASH_ATTENTION", None),
                 ("torch CUDNN", "CUDNN_ATTENTION", None)]
    kws = {impl: kw for impl, _, kw, _ in model_rows(a)}
    sched_of = {impl: s for impl, s, _, _ in model_rows(a)}
    bcs = [int(x) for x in a.block_sizes.split(",")]
    rows = []
    bar = tqdm(total=len(jobs) + len(bcs), desc="fig2", unit="run")
    for impl, what, tiles in jobs:
        r = base_row(a, "2a", impl, sched_of[impl], modeled(a, sched_of[impl], kws[impl]), "measured")
        try:
            if impl.startswith("cuflash"):
                kw = {"schedule": what}
                if tiles:
                    kw["block_sizes"] = tiles

                def fwd(kw=kw):
                    return cuflash.attention(q, k, v, **kw)

                r.update(err(fwd()))
                r["fwd_ms"] = bench.time_cuda(fwd, warmup=a.warmup, rep=a.rep, flush=flush)["median_ms"]
                if what == "fa2":
                    def fb():
                        o, lse = cuflash.attention(q, k, v, return_lse=True)
                        return cuflash.attention_backward(dout, q, k, v, o, lse)

                    try:
                        r.update(bwd_err(fb()))
                        r["fwdbwd_ms"] = bench.time_cuda(fb, warmup=a.warmup, rep=a.rep, flush=flush)["median_ms"]
                        r["gflops_fwdbwd"] = traffic.attention_flops(
                            a.batch, a.heads, a.seqlen, a.seqlen, a.head_dim, backward=True) / 1e9
                    except Exception as e:  # backward missing or failing: forward only
                        r["note"] = f"backward: {type(e).__name__}: {e}"[:200]
                code = f"cuflash.attention(q, k, v, schedule={what!r}" + (f", block_sizes={tiles})" if tiles else ")")
                setup = _setup_code(a)
            else:
                torch, SDPBackend, sdpa_kernel = th
                F = torch.nn.functional
                be = getattr(SDPBackend, what)
                tq, tk, tv = (to_torch(torch, x) for x in (q, k, v))

                def tfwd():
                    with sdpa_kernel([be]):
                        return F.scaled_dot_product_attention(tq, tk, tv)

                with torch.no_grad():
                    r.update(err(from_torch(torch, tfwd().detach())))
                    r["fwd_ms"] = bench.time_cuda(tfwd, warmup=a.warmup, rep=a.rep, flush=flush)["median_ms"]
                gq, gk, gv = (x.detach().clone().requires_grad_(True) for x in (tq, tk, tv))
                gdo = to_torch(torch, dout)

                def tfb():
                    with sdpa_kernel([be]):
                        o = F.scaled_dot_product_attention(gq, gk, gv)
                    o.backward(gdo)

                tfb()  # one backward from zero gradients: its errors (the timed calls accumulate into .grad)
                r.update(bwd_err([from_torch(torch, x.grad) for x in (gq, gk, gv)]))
                r["fwdbwd_ms"] = bench.time_cuda(tfb, warmup=a.warmup, rep=a.rep, flush=flush)["median_ms"]
                r["gflops_fwdbwd"] = traffic.attention_flops(a.batch, a.heads, a.seqlen, a.seqlen, a.head_dim,
                                                             backward=True,
                                                             schedule="standard" if what == "MATH" else "fa2") / 1e9
                code = "with sdpa_kernel([BE]):\n    torch.nn.functional.scaled_dot_product_attention(q, k, v)"
                setup = _torch_setup(a, what)
            r["tflops_fwd"] = r["gflops_fwd"] / r["fwd_ms"]
            if use_ncu:
                m = ncu.try_measure(code, setup, timeout=600)
                c = ncu.compare(m["bytes"] if m else None, r["hbm_gb_model"] * 1e9)
                r["hbm_gb_measured"] = c["measured_bytes"] / 1e9 if c["measured_bytes"] else None
                r["measured_over_modeled"] = c["measured_over_modeled"]
                r["model_note"] = c["model_note"]
                if m:
                    r["ncu_launches"] = m["n_launches"]
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"[:300]
            print(f"fig2: {impl} failed: {r['error']}")
        rows.append(r)
        bar.update(1)
    ref_ms = next((r.get("fwd_ms") for r in rows if r["impl"] == "torch FLASH" and r.get("fwd_ms")), None)
    for r in rows:
        if ref_ms and r.get("fwd_ms"):
            r["time_vs_torch_flash"] = r["fwd_ms"] / ref_ms
    # (b) fa1 block size sweep
    for bc in bcs:
        nb = traffic.attention_bytes("fa1", a.batch, a.heads, a.seqlen, a.seqlen, a.head_dim, 64, bc, a.dtype, False)
        r = base_row(a, "2b", "cuflash fa1", "fa1", nb, "measured")
        r.update(Br=64, Bc=bc)
        try:
            def f(bc=bc):
                return cuflash.attention(q, k, v, schedule="fa1", block_sizes=(64, bc))

            r.update(err(f()))
            r["fwd_ms"] = bench.time_cuda(f, warmup=a.warmup, rep=a.rep, flush=flush)["median_ms"]
            r["tflops_fwd"] = r["gflops_fwd"] / r["fwd_ms"]
            if use_ncu:
                m = ncu.try_measure(f"cuflash.attention(q, k, v, schedule='fa1', block_sizes=(64, {bc}))",
                                    _setup_code(a), timeout=600)
                c = ncu.compare(m["bytes"] if m else None, nb)
                r["hbm_gb_measured"] = c["measured_bytes"] / 1e9 if c["measured_bytes"] else None
                r["measured_over_modeled"] = c["measured_over_modeled"]
                r["model_note"] = c["model_note"]
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"[:300]
            print(f"fig2: fa1 Bc={bc} failed: {r['error']}")
        rows.append(r)
        bar.update(1)
    bar.close()
    meta = {"predicted": False, "ncu": use_ncu, "paper_A100_fwdbwd": PAPER_A100_FWDBWD,
            "anchor_H200_fwdbwd": ANCHOR_H200_FWDBWD, "args": vars(a),
            "note": "GFLOPs = forward matmul FLOPs 4·B·H·N²·d (fwd+bwd: x3 standard, x3.5 flash); HBM GB: model "
                    "(cuflash.traffic) and, with ncu, measured DRAM bytes of the forward",
            "error": "batch 0, heads 0-1 vs float64 reference: max_abs_err = max|out-ref|, max_rel_err = "
                     "max|out-ref| / max|ref| (norm-wise), mean_abs_err, out_rounding_abs_err = max|round(ref)-ref| "
                     "(rounding to the output dtype: the floor all implementations share)"}
    path = bench.write_results(a.name, rows, meta)
    plot(rows, plots / f"{a.name}.png", f"{env.get('gpu')} (measured)")
    return path, rows


# ----------------------------------------------------------------------------------------------------------
def plot(rows, path, label):
    plt = pyplot()

    ra = [r for r in rows if r["figure"] == "2a" and r.get("fwd_ms")]
    rb = [r for r in rows if r["figure"] == "2b" and r.get("fwd_ms")]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    names = [r["impl"] for r in ra]
    x = np.arange(len(ra))
    axes[0].bar(x, [r["gflops_fwd"] for r in ra], color="tab:blue")
    axes[0].set_title("forward GFLOPs")
    w = 0.4
    axes[1].bar(x - w / 2, [r["hbm_gb_model"] for r in ra], w, label="model", color="tab:orange")
    meas = [r.get("hbm_gb_measured") or 0 for r in ra]
    if any(meas):
        axes[1].bar(x + w / 2, meas, w, label="measured (ncu)", color="tab:red")
    axes[1].set_title("HBM GB (forward)")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=8)
    axes[2].bar(x, [r["fwd_ms"] for r in ra], color="tab:green")
    axes[2].set_title("forward runtime (ms)")
    axes[2].set_yscale("log")
    for ax in axes[:3]:
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax = axes[3]
    if rb:
        bc = [r["Bc"] for r in rb]
        ax.plot(bc, [r["hbm_gb_model"] for r in rb], "o-", color="tab:orange", label="HBM GB (model)")
        if any(r.get("hbm_gb_measured") for r in rb):
            ax.plot(bc, [r.get("hbm_gb_measured") or np.nan for r in rb], "s--", color="tab:red",
                    label="HBM GB (measured)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size Bc (Br = 64)")
        ax.set_ylabel("HBM GB")
        ax2 = ax.twinx()
        ax2.plot(bc, [r["fwd_ms"] for r in rb], "^-", color="tab:green", label="runtime (ms)")
        ax2.set_ylabel("runtime (ms)")
        ax.set_title("FA-1: block size sweep")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        # below the axes: inside, it hid the HBM curve (top right) whatever the data
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
                  frameon=False)
    shape = ra[0]["shape"] if ra else ""
    fig.suptitle(f"FlashAttention Fig. 2 — {shape} {rows[0]['dtype'] if rows else ''} — {label}")
    predicted_watermark(fig, label)
    save_figure(fig, path, dpi=110, mkdir=False)


def replot(a, plots) -> int:
    """Redraw plots/<name>.png (<name>_predicted.png with --predict) from the results JSON, as recorded."""
    return replot_recorded(a, plots, a.name, plot, "roofline model")


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if not (a.replot or a.predict or bench.has_gpu()):
        scratch_out(a, "fig2")
    plots = output_dirs(a)
    if a.replot:
        return replot(a, plots)
    if predicted_mode(a, f"fig2: no CUDA device: writing the model with roofline-predicted times for {a.gpu} "
                         f"(PREDICTED)"):
        path, rows = run_predicted(a, plots)
    else:
        path, rows = run_measured(a, plots)
    print_results(path, rows, ("figure", "impl", "Bc", "mode", "gflops_fwd", "hbm_gb_model", "hbm_gb_measured",
                               "measured_over_modeled", "fwd_ms", "fwdbwd_ms", "max_abs_err", "max_rel_err",
                               "bwd_max_abs_err", "mean_abs_err"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
