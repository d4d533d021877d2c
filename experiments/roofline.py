"""A roofline of every cuflash kernel: arithmetic intensity against achieved FLOP/s.

Arithmetic intensity = FLOPs / HBM bytes, with the bytes both *modeled* (``cuflash.traffic``: filled markers)
and, when Nsight Compute is present, *measured* (``cuflash.ncu`` DRAM bytes: hollow markers). The ceilings are
measured in the same run: a large device-to-device copy (bytes read + written per second) and a bf16 matmul
(torch 8192^3 when torch is present, else CuPy float16). Roofline model: Williams, Waterman & Patterson,
"Roofline: an insightful visual performance model for multicore architectures" (CACM 2009).
Without a GPU (or with ``--predict``): every point sits at its roofline-predicted throughput for ``--gpu``
(datasheet ceilings, measured copy/matmul for the H200 from the anchors), labelled PREDICTED, in
roofline_predicted.json|csv and plots/roofline_predicted.png: with ``--predict`` in experiments/results (or
``--out``), without a GPU and without ``--predict`` in ``--out`` or a new temporary folder it names (never over the
committed files). Exit status 0 either way.

    python experiments/roofline.py [--quick] [--predict] [--gpu H200] [--ncu auto|on|off] [--out DIR]
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
    nonnegative_int, output_dirs, positive_int, predicted_mode, predicted_watermark, print_results, pyplot,
    save_figure, scratch_out)

import numpy as np  # noqa: E402

from cuflash import bench, gpus, ncu, traffic  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rep", type=positive_int, default=20)
    ap.add_argument("--warmup", type=nonnegative_int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke size: smaller inputs, no ncu unless --ncu on")
    ap.add_argument("--predict", action="store_true")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--ncu", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--plots", default=None)
    return ap.parse_args(argv)


def kernels(quick: bool):
    """(name, dtype, tensor_cores, flops, bytes, setup code, call code) for every kernel on the plot."""
    sc = 4 if quick else 1
    out = []
    R, C = 16384 // sc, 16384
    out.append(("softmax fp32 online", "float32", False, traffic.softmax_flops(R, C), traffic.softmax_bytes(R, C, "float32"),
                f"x = cupy.random.standard_normal(({R}, {C}), dtype=cupy.float32)",
                "cuflash.softmax(x, axis=-1)"))
    out.append(("softmax bf16 safe", "bfloat16", False, traffic.softmax_flops(R, C, "safe"),
                traffic.softmax_bytes(R, C, "bfloat16", "safe"),
                f"x = from_float32(cupy.random.standard_normal(({R}, {C}), dtype=cupy.float32), cuflash.bfloat16)",
                "cuflash.softmax(x, axis=-1, method='safe')"))
    T, H = 16384 // sc, 4096
    for kind, fn, extra in (("layer", "layer_norm", "w, b, 1e-5"), ("rms", "rms_norm", "w, 1e-6")):
        out.append((f"{kind}_norm bf16 +residual (fused)", "bfloat16", False,
                    traffic.norm_flops(T, H, kind, True), traffic.norm_bytes(T, H, "bfloat16", kind, residual=True),
                    f"x, r = (from_float32(cupy.random.standard_normal(({T}, {H}), dtype=cupy.float32), cuflash.bfloat16) "
                    f"for _ in range(2))\nw, b = (from_float32(cupy.ones({H}, dtype=cupy.float32), cuflash.bfloat16) "
                    f"for _ in range(2))",
                    f"cuflash.{fn}(x, ({H},), {extra}, residual=r)"))
    B, Hh, N, d = (1, 16, 4096, 128) if quick else (4, 16, 4096, 128)
    qkv = (f"q, k, v = (from_float32(cupy.random.standard_normal(({B}, {Hh}, {N}, {d}), dtype=cupy.float32), "
           f"cuflash.bfloat16) for _ in range(3))")
    for sched, tiles, causal, tc in (("fa2", (128, 64), False, True), ("fa2", (128, 64), True, True),
                                     ("fa1", (64, 64), False, False), ("standard", (None, None), False, False)):
        fl = traffic.attention_flops(B, Hh, N, N, d, causal=causal)
        nb = traffic.attention_bytes(sched, B, Hh, N, N, d, tiles[0], tiles[1], "bfloat16", causal)
        bs = f", block_sizes={tiles}" if sched == "fa1" else ""
        out.append((f"attention {sched}{' causal' if causal else ''} bf16 d{d}", "bfloat16", tc, fl, nb, qkv,
                    f"cuflash.attention(q, k, v, causal={causal}, schedule={sched!r}{bs})"))
    return out


def ceilings_measured():
    import cupy as cp

    src = cp.empty(1 << 30, dtype=cp.uint8)
    dst = cp.empty_like(src)
    copy = 2 * src.nbytes / (bench.time_cuda(cp.copyto, (dst, src), rep=20)["median_ms"] * 1e-3) / 1e9
    src = dst = None
    n = 8192
    try:
        import torch

        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        t = bench.time_cuda(lambda: a @ b, warmup=5, rep=20)["median_ms"]
        how = "torch bf16 matmul 8192^3"
    except Exception:
        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        b = a.copy()
        t = bench.time_cuda(lambda: a @ b, warmup=5, rep=20)["median_ms"]
        how = "cupy fp16 matmul 8192^3"
    return copy, 2 * n ** 3 / (t * 1e-3) / 1e12, how


def run(a, plots, predicted):
    g = gpus.get(a.gpu)
    ks = kernels(a.quick)
    rows = []
    env = {} if predicted else bench.environment()
    if predicted:
        copy, mm, how = g.copy_GBps(), g.matmul_TFLOPs("bfloat16"), f"{g.name} table ({g.notes})"
        for name, dn, tc, fl, nb, _, _ in ks:
            t = gpus.predict_time_s(nb, fl, g, dn, tensor_cores=tc)
            rows.append({"kernel": name, "dtype": dn, "mode": "predicted", "predicted_for": g.name, "flops": fl,
                         "bytes_model": nb, "ms": t * 1e3, "TFLOPs": fl / t / 1e12, "GBps_model": nb / t / 1e9,
                         "ai_model": fl / nb})
    else:
        import cupy as cp  # noqa: F401
        from tqdm import tqdm

        import cuflash  # noqa: F401
        from cuflash._attention_alt import from_float32

        copy, mm, how = ceilings_measured()
        use_ncu = (a.ncu == "on" or (a.ncu == "auto" and not a.quick)) and ncu.available()
        for name, dn, tc, fl, nb, setup, call in tqdm(ks, desc="roofline", unit="kernel"):
            r = {"kernel": name, "dtype": dn, "mode": "measured", "flops": fl, "bytes_model": nb,
                 "ai_model": fl / nb}
            try:
                ns = {"cupy": cp, "cuflash": cuflash, "from_float32": from_float32}
                cp.random.seed(0)
                exec(setup, ns)
                fn = eval(f"lambda: {call}", ns)
                r["ms"] = bench.time_cuda(fn, warmup=a.warmup, rep=a.rep, flush=True)["median_ms"]
                r["TFLOPs"] = fl / (r["ms"] * 1e-3) / 1e12
                r["GBps_model"] = nb / (r["ms"] * 1e-3) / 1e9
                r["fraction_of_roof"] = r["TFLOPs"] / min(copy * 1e9 * r["ai_model"] / 1e12,
                                                          mm if tc else g.fp32_TFLOPs)
                del ns, fn
                if use_ncu:
                    m = ncu.try_measure(call, "import cuflash\nfrom cuflash._attention_alt import from_float32\n" + setup)
                    r.update(ncu.compare(m["bytes"] if m else None, nb))
                    if m and m["bytes"]:
                        r["ai_measured"] = fl / m["bytes"]
            except Exception as ex:
                r["error"] = f"{type(ex).__name__}: {ex}"[:300]
                print(f"roofline: {name}: {r['error']}")
            rows.append(r)
    # a --quick run never replaces the committed full run's files: <name>_quick[_predicted]
    name = "roofline" + ("_quick" if a.quick else "") + ("_predicted" if predicted else "")
    meta = {"predicted": predicted, "copy_GBps": copy, "matmul_TFLOPs": mm, "matmul_how": how,
            "fp32_simt_TFLOPs_datasheet": g.fp32_TFLOPs, "args": vars(a),
            "note": "PREDICTED: each kernel at min(bytes/BW, flops/peak) from the GPU table" if predicted else
                    "ceilings measured in this run; AI = FLOPs / modeled bytes (and / ncu DRAM bytes)"}
    path = bench.write_results(name, rows, meta)
    label = f"PREDICTED for {g.name} (model, no GPU)" if predicted else f"{env.get('gpu')} (measured)"
    plot(rows, copy, mm, g.fp32_TFLOPs, plots / f"{name}.png", label)
    return path, rows


def plot(rows, copy_gbps, mm_tflops, fp32_tflops, path, label):
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 6))
    ai = np.logspace(-2, 4, 200)
    bw = copy_gbps * 1e9
    ax.plot(ai, np.minimum(bw * ai, mm_tflops * 1e12), "k-", lw=1.5,
            label=f"copy {copy_gbps:.0f} GB/s, matmul {mm_tflops:.0f} TFLOP/s")
    ax.plot(ai, np.minimum(bw * ai, fp32_tflops * 1e12), "k--", lw=1, label=f"fp32 SIMT {fp32_tflops:.1f} TFLOP/s")
    cmap = plt.get_cmap("tab10")
    for i, r in enumerate(x for x in rows if x.get("TFLOPs")):
        c = cmap(i % 10)
        y = r["TFLOPs"] * 1e12
        ax.plot(r["ai_model"], y, "o", color=c, ms=8, label=r["kernel"])
        if r.get("ai_measured"):
            ax.plot(r["ai_measured"], y, "o", mfc="none", color=c, ms=10)
            ax.plot([r["ai_model"], r["ai_measured"]], [y, y], ":", color=c)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte; filled: modeled bytes, hollow: measured)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"Roofline — {label}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    predicted_watermark(fig, label)
    save_figure(fig, path, dpi=110, mkdir=False)


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if not (a.predict or bench.has_gpu()):
        scratch_out(a, "roofline")
    plots = output_dirs(a)
    predicted = predicted_mode(a, f"roofline: no CUDA device: roofline-predicted throughput for {a.gpu} "
                                  f"(PREDICTED)")
    path, rows = run(a, plots, predicted)
    print_results(path, rows, ("kernel", "mode", "ai_model", "ai_measured", "ms", "TFLOPs", "GBps_model",
                               "fraction_of_roof", "measured_over_modeled"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
