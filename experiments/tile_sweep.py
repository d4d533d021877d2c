"""Tile sweep of the FA-2 attention forward: HBM traffic against runtime for every (Br, Bc).

The FlashAttention-2 schedule reads Q once and K, V once per Q tile: HBM bytes per (batch, head) are
``2·Sq·d·s + 4·Sq + 2·ceil(Sq/Br)·Sk·d·s`` (s = element size; ``cuflash.traffic.attention_bytes``), so a
larger Br means less traffic, while Br and Bc together set shared memory, registers and occupancy. This script
runs the forward for every instantiated (Br, Bc) that fits the device's shared memory, times it with CUDA
events (warm-up, median of >= 20), reports TFLOP/s (4·B·H·N²·d, halved when causal), the modeled HBM bytes
and, with ``--ncu`` (and ``ncu`` on PATH), the DRAM bytes measured by Nsight Compute
(dram__bytes_read.sum + dram__bytes_write.sum of one launch, via ``cuflash.ncu``; without it the script re-runs
itself under ``ncu`` in ``--single`` mode). ncu flushes caches before the profiled launch, so measured bytes
are cold-L2 DRAM bytes: K/V re-reads by later Q tiles of the same head mostly hit the 60 MB L2 and the
measured bytes fall below the model, which counts every tile read as HBM traffic.

Writes experiments/results/attention_tile_sweep.json|csv and plots/attention_tile_sweep.png.

    python experiments/tile_sweep.py                    # batch 4, heads 16, seqlen 4096, head_dim 64 and 128, bf16
    python experiments/tile_sweep.py --quick            # smoke size
    python experiments/tile_sweep.py --ncu --causal     # with measured DRAM bytes, causal mask
    cuflash sweep [same args]
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NCU_METRICS = "dram__bytes_read.sum,dram__bytes_write.sum"


def model_bytes(batch, heads, seqlen, head_dim, Br, Bc, dtype, causal):
    """HBM bytes of the FA-2 forward (cuflash.traffic when present, else the no-mask/causal closed form)."""
    try:
        from cuflash import traffic

        return int(traffic.attention_bytes("fa2", batch, heads, seqlen, seqlen, head_dim, Br, Bc, dtype, causal))
    except Exception:  # traffic.py missing or older: the same count, written out
        s = np.dtype(dtype).itemsize
        Tr = math.ceil(seqlen / Br)
        kv = 0
        for i in range(Tr):
            hi = min(seqlen, (i + 1) * Br) if causal else seqlen
            kv += 2 * hi * head_dim * s
        return int(batch * heads * (2 * seqlen * head_dim * s + 4 * seqlen + kv))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rep", type=int, default=30, help="timed repetitions (median reported, >= 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ncu", action="store_true", help="also measure DRAM bytes with Nsight Compute")
    ap.add_argument("--quick", action="store_true", help="smoke size: batch 1, heads 4, seqlen 1024, rep 20")
    ap.add_argument("--single", default=None, help=argparse.SUPPRESS)  # "d,Br,Bc,warps": one launch (ncu)
    ap.add_argument("--name", default="attention_tile_sweep", help="results/plot file stem")
    a = ap.parse_args(argv)
    if a.quick:
        a.batch, a.heads, a.seqlen, a.rep, a.warmup = 1, 4, 1024, 20, 2
    a.rep = max(a.rep, 20)
    return a


def _inputs(cp, a, d, dt, seed=0):
    rng = cp.random.default_rng(seed)
    shape = (a.batch, a.heads, a.seqlen, d)
    return [rng.standard_normal(shape, dtype=np.float32).astype(dt) for _ in range(3)]


def run_single(a) -> int:
    """One warm-up launch and one profiled launch of a configuration (what ncu measures: the 2nd launch)."""
    import cupy as cp
    from cuflash._dtypes import bfloat16
    from cuflash.attention import attention

    d, br, bc, w = (int(x) for x in a.single.split(","))
    dt = bfloat16 if a.dtype == "bfloat16" else np.dtype(np.float16)
    q, k, v = _inputs(cp, a, d, dt)
    for _ in range(2):
        attention(q, k, v, causal=a.causal, block_sizes=(br, bc, w))
    cp.cuda.Device().synchronize()
    return 0


def _ncu_available() -> bool:
    try:
        from cuflash import ncu as ncu_mod

        return ncu_mod.available()
    except ImportError:
        return shutil.which("ncu") is not None


def ncu_bytes(a, d, br, bc, w):
    """DRAM bytes (read + write) of the 2nd launch of configuration (d, Br, Bc, warps), or None when ncu fails."""
    try:  # the shared helper (profiles only the call, after a warm-up in the setup)
        from cuflash import ncu as ncu_mod

        setup = (f"import numpy as np, cupy as cp\nfrom cuflash.attention import attention\n"
                 f"from cuflash._dtypes import bfloat16\ndt = bfloat16 if {a.dtype!r} == 'bfloat16' else np.float16\n"
                 f"rng = np.random.default_rng(0)\n"
                 f"q, k, v = (cp.asarray(rng.standard_normal(({a.batch}, {a.heads}, {a.seqlen}, {d}), "
                 f"dtype=np.float32)).astype(dt) for _ in range(3))\n"
                 f"attention(q, k, v, causal={a.causal}, block_sizes=({br}, {bc}, {w}))")
        r = ncu_mod.try_measure(f"attention(q, k, v, causal={a.causal}, block_sizes=({br}, {bc}, {w}))", setup,
                                kernel_regex="attention_fwd_kernel")
        return int(r["bytes"]) if r else None
    except ImportError:
        pass
    ncu = shutil.which("ncu")  # fallback: re-run this script in --single mode under ncu
    if not ncu:
        return None
    cmd = [ncu, "--clock-control", "none", "--metrics", NCU_METRICS, "--csv", "--kernel-name", "regex:attention_fwd",
           "--launch-skip", "1", "--launch-count", "1",
           sys.executable, str(Path(__file__).resolve()), "--single", f"{d},{br},{bc},{w}",
           "--batch", str(a.batch), "--heads", str(a.heads), "--seqlen", str(a.seqlen), "--dtype", a.dtype]
    if a.causal:
        cmd.append("--causal")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    except Exception as e:
        print(f"ncu failed for d={d} Br={br} Bc={bc} warps={w}: {e}", file=sys.stderr)
        return None
    return parse_ncu_csv(r.stdout)


_UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
          "kibyte": 1024, "mibyte": 1024**2, "gibyte": 1024**3}


def parse_ncu_csv(text: str):
    """Sum dram__bytes_read.sum + dram__bytes_write.sum from ncu --csv output (units converted to bytes)."""
    import csv
    import io

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return None
    total, seen = 0.0, 0
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        name = row.get("Metric Name", "")
        if name in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            unit = (row.get("Metric Unit") or "byte").strip().lower()
            val = float((row.get("Metric Value") or "nan").replace(",", ""))
            total += val * _UNITS.get(unit, 1)
            seen += 1
    return int(total) if seen == 2 else None


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from cuflash import bench

    if not bench.has_gpu():
        print("tile_sweep: no CUDA device visible (run on the GPU machine)")
        return 2
    if a.single:
        return run_single(a)
    import cupy as cp
    from tqdm import tqdm
    from cuflash import _compile
    A = importlib.import_module("cuflash.attention")
    from cuflash._dtypes import bfloat16

    dt = bfloat16 if a.dtype == "bfloat16" else np.dtype(np.float16)
    dev = cp.cuda.runtime.getDevice()
    limit = _compile.max_shared_optin(dev)
    configs = [(d, br, bc, w) for d in a.head_dims for (br, bc, w) in A.instantiated_tiles(dt, d)
               if A.smem_bytes(dt, d, br, bc) <= limit]
    use_ncu = a.ncu and _ncu_available()
    if a.ncu and not use_ncu:
        print("tile_sweep: --ncu given but ncu is not on PATH; measured bytes left empty")
    rows = []
    inputs = {}
    for d, br, bc, w in tqdm(configs, desc="tile sweep", unit="cfg"):
        if d not in inputs:
            inputs.clear()
            inputs[d] = _inputs(cp, a, d, dt)
        q, k, v = inputs[d]
        fn = lambda: A.attention(q, k, v, causal=a.causal, block_sizes=(br, bc, w))  # noqa: E731
        t = bench.time_cuda(fn, warmup=a.warmup, rep=a.rep)
        fl = A.flops(a.batch, a.heads, a.seqlen, a.seqlen, d, a.causal)
        mb = model_bytes(a.batch, a.heads, a.seqlen, d, br, bc, a.dtype, a.causal)
        row = {"head_dim": d, "Br": br, "Bc": bc, "warps": w, "rows_per_warp": br // w, "stages": A.STAGES,
               "smem_bytes": A.smem_bytes(dt, d, br, bc), "default": (br, bc, w) == A.DEFAULT_TILES[(d, a.causal)],
               "batch": a.batch, "heads": a.heads, "seqlen": a.seqlen, "dtype": a.dtype, "causal": a.causal,
               "median_ms": t["median_ms"], "p20_ms": t["p20_ms"], "p80_ms": t["p80_ms"],
               "tflops": fl / (t["median_ms"] * 1e-3) / 1e12, "model_bytes": mb,
               "model_GBps": mb / (t["median_ms"] * 1e-3) / 1e9, "ncu_dram_bytes": None}
        if use_ncu:
            row["ncu_dram_bytes"] = ncu_bytes(a, d, br, bc, w)
        rows.append(row)
    inputs.clear()
    meta = {"what": "FA-2 forward tile sweep: runtime, TFLOP/s, modeled and measured HBM bytes per (Br, Bc)",
            "flops": "4*B*H*N^2*d (halved when causal)", "timing": f"CUDA events, warmup {a.warmup}, median of {a.rep}",
            "model": "cuflash.traffic.attention_bytes('fa2', ...)", "ncu_metrics": NCU_METRICS if use_ncu else None,
            "smem_limit_bytes": limit}
    path = bench.write_results(a.name, rows, meta)
    print(bench.table(rows, ["head_dim", "Br", "Bc", "warps", "default", "median_ms", "tflops", "model_bytes",
                             "ncu_dram_bytes"]))
    for d in a.head_dims:
        rs = [r for r in rows if r["head_dim"] == d]
        if rs:
            best = min(rs, key=lambda r: r["median_ms"])
            dflt = next((r for r in rs if r["default"]), None)
            note = f" (default {dflt['Br']}x{dflt['Bc']}/{dflt['warps']}w: {dflt['tflops']:.0f})" if dflt else ""
            print(f"head_dim {d}: fastest Br={best['Br']} Bc={best['Bc']} warps={best['warps']} "
                  f"{best['tflops']:.0f} TFLOP/s{note}")
    plot(rows, a, bench.PLOTS / f"{a.name}.png")
    print(f"wrote {path} and plots/{a.name}.png")
    return 0


def plot(rows, a, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({r["head_dim"] for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(6 * len(dims), 4.5), squeeze=False)
    for ax, d in zip(axes[0], dims):
        rs = [r for r in rows if r["head_dim"] == d]
        for key, marker, label in (("model_bytes", "o", "modeled HBM bytes"),
                                   ("ncu_dram_bytes", "s", "ncu DRAM bytes")):
            pts = [(r["median_ms"], r[key]) for r in rs if r.get(key)]
            if not pts:
                continue
            ax.scatter([p[0] for p in pts], [p[1] / 1e6 for p in pts], marker=marker, label=label,
                       facecolors="none" if key == "ncu_dram_bytes" else None,
                       edgecolors="C1" if key == "ncu_dram_bytes" else None)
        for r in rs:
            ax.annotate(f"{r['Br']}x{r['Bc']}/{r['warps']}w{'*' if r['default'] else ''}\n{r['tflops']:.0f} TF/s",
                        (r["median_ms"], r["model_bytes"] / 1e6), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
        ax.set_xlabel("runtime (ms, median)")
        ax.set_ylabel("HBM traffic (MB)")
        ax.set_title(f"head_dim {d}: B={a.batch} H={a.heads} N={a.seqlen} {a.dtype}"
                     f"{' causal' if a.causal else ''}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("FA-2 forward tile sweep: one point per (Br, Bc, warps) (* = default)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
