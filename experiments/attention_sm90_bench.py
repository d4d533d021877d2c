"""Hopper attention forward (wgmma, sm_90a) against cuDNN and FlashAttention through torch SDPA, same run.

FlashAttention-2/3 benchmark convention (Dao 2023; Shah et al. 2024): 16K tokens in total (batch = 16384 /
seqlen), hidden 2048 (heads = 2048 / head_dim), head_dim 64 and 128, seqlen 2K ... 16K, causal and not,
bfloat16 and float16. TFLOP/s = 4·B·H·N²·d / t, halved when causal. Timed in the same run: cuflash sm90
(this kernel), cuflash FA-2 (mma.sync), torch SDPA with the CUDNN_ATTENTION and FLASH_ATTENTION backends. Each
speed sits beside its max abs error against a float64 reference on a sample of query rows (batch 0, all heads).

The SASS evidence field (meta.sass) holds, for each default instantiation, ptxas's registers / spill bytes
(``_compile.compile_offline``) and the HGMMA / HMMA / local-memory instruction counts of the cubin (cuobjdump
when it is on PATH or in the CUDA toolkit; otherwise the wgmma count of the PTX, marked as such).

Writes experiments/results/attention_sm90_bench.json|csv and plots/attention_sm90_tflops.png; a --quick run writes
attention_sm90_bench_quick.json|csv and plots/attention_sm90_bench_quick.png (another --name: <name>.json|csv and
plots/<name>.png). Without a GPU (or off compute capability 9.0): one line, exit 2.

    python experiments/attention_sm90_bench.py            # full sweep (< 90 s on the H200)
    python experiments/attention_sm90_bench.py --quick    # bf16, seqlen 2K and 16K (unless given), all tiles
    python experiments/attention_sm90_bench.py --sass-only  # no GPU: SASS evidence of every instantiation
    CUFLASH_SM90_VARIANT=simple python experiments/...    # another default variant
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    add_shape_args, default_help, fill_defaults, half_to_torch as to_torch, nonnegative_int, plot_tflops_grid,
    positive_int, run_names, sample_ref, sdpa_peers)

TOKENS, HIDDEN = 16384, 2048
FULL = {"seqlens": [2048, 4096, 8192, 16384], "dtypes": ["bfloat16", "float16"], "rep": 20, "warmup": 3}
QUICK = {"seqlens": [2048, 16384], "dtypes": ["bfloat16"]}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(ap, FULL["seqlens"])
    ap.set_defaults(seqlens=None, dtypes=None)  # filled from FULL / QUICK below
    ap.add_argument("--rep", type=positive_int, help=default_help("timed launches", "rep", FULL, QUICK))
    ap.add_argument("--warmup", type=nonnegative_int, help=default_help("untimed launches", "warmup", FULL, QUICK))
    ap.add_argument("--no-torch", action="store_true", help="skip the torch SDPA peers")
    ap.add_argument("--no-fa2", action="store_true", help="skip cuflash's FA-2 kernel")
    ap.add_argument("--no-variants", action="store_true",
                    help="time only the default variant (else also ws_nopp and simple, default tiles)")
    ap.add_argument("--all-tiles", action="store_true", help="also time every instantiated (Br, Bc, pv_n)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --seqlens (2048 16384) and --dtypes (bfloat16), not "
                         "what is given, and turns on --all-tiles; writes attention_sm90_bench_quick unless --name")
    ap.add_argument("--name", default=None,
                    help="results file stem (default attention_sm90_bench; attention_sm90_bench_quick with --quick); "
                         "the plot is plots/attention_sm90_tflops.png for attention_sm90_bench, else "
                         "plots/<name>.png")
    ap.add_argument("--sass-only", action="store_true",
                    help="no GPU needed: compile every instantiation, write the SASS evidence "
                         "(experiments/results/attention_sm90_sass.json) and exit")
    a = fill_defaults(ap.parse_args(argv), FULL, QUICK)
    a.all_tiles = a.all_tiles or a.quick
    a.plot = run_names(a, "attention_sm90_bench", "attention_sm90_tflops")
    return a


# ---------------------------------------------------------------------------------------------- SASS evidence
def _disassembler():
    """(disassembler, its SASS argument): cuobjdump -sass, else nvdisasm -c (on the PATH or in the nvidia cu13 wheel
    beside NVRTC); None when neither is there."""
    for cand in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if cand and os.path.exists(cand):
            return cand, "-sass"
    try:
        from cupy_backends.cuda.libs import nvrtc

        wheel = Path(nvrtc.__file__).parents[3] / "nvidia" / "cu13" / "bin" / "nvdisasm"
    except Exception:  # pragma: no cover - depends on the install
        wheel = None
    for cand in (shutil.which("nvdisasm"), wheel):
        if cand and os.path.exists(cand):
            return str(cand), "-c"
    return None


def sass_evidence(configs) -> list[dict]:
    """ptxas report + instruction counts for each (dtype, head_dim, variant, Br, Bc, pv_n) instantiation.

    One NVRTC compile per instantiation with the run-time options (sm_90a) and ``--ptxas-options=-v``.
    """
    from cupy_backends.cuda.libs import nvrtc

    from cuflash import _attention_sm90 as S90
    from cuflash import _compile

    tool = _disassembler()
    code = (_compile.SRC_DIR / S90.SOURCE).read_text()
    out = []
    for cfg in configs:
        opts = list(_compile.options(S90.compile_options(cfg[2]))) + ["-ftz=true", "--ptxas-options=-v"]
        name = S90.kernel_name(*cfg)
        row = {"kernel": name}
        try:
            prog = nvrtc.createProgram(code, S90.SOURCE, [], [])
            try:
                nvrtc.addNameExpression(prog, name)
                nvrtc.compileProgram(prog, opts)
                log, cubin, ptx = nvrtc.getProgramLog(prog), nvrtc.getCUBIN(prog), nvrtc.getPTX(prog)
            finally:
                nvrtc.destroyProgram(prog)
            row.update({k: int(m.group(1)) if (m := r.search(log)) else 0 for k, r in _compile._PTXAS_RE.items()})
            row["ptxas_notes"] = [ln.strip()[:160] for ln in log.splitlines() if "C75" in ln or "arning" in ln]
            ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
            row["ptx_wgmma_mma_async"] = len(re.findall(r"wgmma\.mma_async", ptx))
            if tool:
                with tempfile.TemporaryDirectory() as tmp:
                    f = Path(tmp) / "k.cubin"
                    f.write_bytes(cubin + b"\0")  # getCUBIN drops the trailing byte of the ELF image
                    sass = subprocess.run([*tool, str(f)], capture_output=True, text=True, timeout=60).stdout
                ops = Counter(m.split(".")[0] for m in re.findall(
                    r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M))
                row.update(sass_HGMMA=ops["HGMMA"], sass_HMMA=ops["HMMA"], sass_LDL=ops["LDL"], sass_STL=ops["STL"],
                           sass_target="sm_90a" if "sm_90a" in sass else "?")
            else:
                row["sass_note"] = "no cuobjdump / nvdisasm: PTX wgmma count only (see attention_sm90_sass.json)"
        except Exception as e:  # pragma: no cover - depends on the toolkit
            row["error"] = repr(e)[:200]
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- peers
def from_torch(torch, t, dt):
    import cupy as cp

    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return cp.from_dlpack(t.view(torch.int16)).view(dt)
    return cp.from_dlpack(t)


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from cuflash import bench

    if a.sass_only:
        from cuflash import _attention_sm90 as S90

        sass = sass_evidence(S90.configurations())
        for r in sass:
            print(r)
        path = bench.write_results("attention_sm90_sass", sass, {
            "what": "ptxas report (compile_offline, sm_90a) and SASS instruction counts (cuobjdump -sass or "
                    "nvdisasm -c) of every instantiation of cuda_src/attention_fwd_sm90.cu",
            "disassembler": " ".join(_disassembler() or ("not found",))})
        print(f"wrote {path}")
        return 0
    if not bench.has_gpu():
        print("attention_sm90_bench: no CUDA device visible (run on the H200)")
        return 2
    import cupy as cp
    from tqdm import tqdm

    from cuflash import _attention_sm90 as S90
    from cuflash._attn_common import prepare
    from cuflash._dtypes import bfloat16

    cc = cp.cuda.Device().compute_capability
    if cc != "90":
        print(f"attention_sm90_bench: needs compute capability 9.0, this device has {cc}")
        return 2
    # the configurations to time, each first run once in a subprocess (a hang or crash is reported, not fatal)
    timed = []
    for cfg in S90.configurations():
        dn_ = "bfloat16" if np.dtype(cfg[0]) == np.dtype(bfloat16) else "float16"
        if dn_ not in a.dtypes or cfg[1] not in a.head_dims:
            continue
        default = cfg[3:] in (S90.TILES[(cfg[2], cfg[1])][0], S90.SHORT_TILES.get((cfg[2], cfg[1])),
                              S90.WIDE_TILES.get((cfg[2], cfg[1])))  # by seqlen_q and seqlen_k
        if (cfg[2] in S90.default_variants() and default) or (not a.no_variants and (default or a.all_tiles)):
            timed.append(cfg)
    checks = S90.self_check(timed)
    for key, msg in checks.items():
        if msg:
            print(f"attention_sm90_bench: {key} skipped: {msg[:300]}")
    th = None if a.no_torch else sdpa_peers("attention_sm90_bench")
    combos = [(dn, d, n, m) for dn in a.dtypes for d in a.head_dims for n in a.seqlens for m in a.masks]
    rows = []
    rng = np.random.default_rng(0)
    for dn, d, n, mask in tqdm(combos, desc="sm90 attention bench", unit="cfg"):
        dt = bfloat16 if dn == "bfloat16" else np.dtype(np.float16)
        causal = mask == "causal"
        B, H = max(TOKENS // n, 1), HIDDEN // d
        shape = (B, H, n, d)
        q, k, v = (cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dt) for _ in range(3))
        fl = S90.flops(B, H, n, n, d, causal)
        sample = np.unique(np.linspace(0, n - 1, 48).astype(int))
        ref = sample_ref(q, k, v, causal, sample)

        def err(out):
            o = cp.asarray(out)[0][:, sample].astype(cp.float64)
            return float(cp.abs(o - ref).max())

        row = {"dtype": dn, "head_dim": d, "seqlen": n, "causal": causal, "batch": B, "heads": H}
        p = prepare(q, k, v, causal=causal)
        var, br, bc, pv = S90.choose(p)
        row["sm90_variant"] = f"{var} {br}x{bc}/pv{pv}"
        impls = []
        for cfg in timed:
            key = S90.config_key(*cfg)
            if np.dtype(cfg[0]) != np.dtype(dt) or cfg[1] != d:
                continue
            label = "sm90" if cfg[2:] == (var, br, bc, pv) else f"sm90_{cfg[2]}_{cfg[3]}x{cfg[4]}_pv{cfg[5]}"
            if checks.get(key):
                row[f"{label}_note"] = checks[key][:160]
                continue
            impls.append((label, lambda c=cfg: S90.forward(p, (c[3], c[4]), pv_n=c[5], variant=c[2])[0]))
        if not a.no_fa2:
            from cuflash.attention import attention

            impls.append(("fa2", lambda: attention(q, k, v, causal=causal, schedule="fa2")))
        for name, fn in impls:
            try:
                row[f"{name}_err"] = err(fn())
                t = bench.time_cuda(fn, warmup=a.warmup, rep=a.rep)
                row[f"{name}_ms"] = t["median_ms"]
                row[f"{name}_tflops"] = fl / (t["median_ms"] * 1e-3) / 1e12
            except Exception as e:
                row[f"{name}_tflops"] = None
                row[f"{name}_note"] = repr(e)[:160]
        if th is not None:
            torch, SDPBackend, sdpa_kernel = th
            tq, tk, tv = (to_torch(torch, x) for x in (q, k, v))
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                def tfn():
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                try:
                    out = tfn()
                    torch.cuda.synchronize()
                    row[f"torch_{name}_err"] = err(from_torch(torch, out, dt))
                    tt = bench.time_cuda(tfn, warmup=a.warmup, rep=a.rep)
                    row[f"torch_{name}_ms"] = tt["median_ms"]
                    row[f"torch_{name}_tflops"] = fl / (tt["median_ms"] * 1e-3) / 1e12
                except Exception as e:
                    row[f"torch_{name}_tflops"] = None
                    row[f"torch_{name}_note"] = repr(e)[:160]
            del tq, tk, tv
        for peer in ("torch_cudnn", "torch_flash", "fa2"):
            if row.get("sm90_tflops") and row.get(f"{peer}_tflops"):
                row[f"sm90_vs_{peer}"] = row["sm90_tflops"] / row[f"{peer}_tflops"]
        rows.append(row)
        impls = None
        cp.get_default_memory_pool().free_all_blocks()

    sass = sass_evidence([c for c in timed if c[2] in S90.default_variants() and c[3:] == S90.TILES[(c[2], c[1])][0]])
    meta = {"what": "attention forward TFLOP/s, sm90 wgmma kernel vs cuDNN / FlashAttention (torch SDPA), "
                    "16K tokens, hidden 2048",
            "flops": "4*B*H*N^2*d / t, halved when causal",
            "timing": f"CUDA events, warmup {a.warmup}, median of {a.rep}",
            "error": "max abs error vs float64 reference on 48 query rows x all heads of batch 0",
            "kernel": "cuda_src/attention_fwd_sm90.cu: wgmma m64nNk16 for S=QK^T (smem x smem) and O+=PV (P in "
                      "registers), K/V by cp.async into 128B-swizzled smem; ws = producer warpgroup + mbarrier "
                      "3-stage ring + setmaxnreg, 2 consumer warpgroups, intra-warpgroup pipelining, ping-pong; "
                      "ws_nopp = without ping-pong; simple = all threads load, 2 stages",
            "default_variant": S90.DEFAULT_VARIANT,
            "self_check": {"/".join(map(str, k)): (v or "ok")[:300] for k, v in checks.items()},
            "sass": sass}
    path = bench.write_results(a.name, rows, meta)
    extra = sorted({c for r in rows for c in r
                    if c.startswith("sm90_") and c.endswith("_tflops") and c != "sm90_tflops"})
    cols = ["dtype", "head_dim", "seqlen", "causal", "sm90_tflops", "sm90_err", *extra, "fa2_tflops",
            "torch_cudnn_tflops", "torch_cudnn_err", "torch_flash_tflops", "sm90_vs_torch_cudnn", "sm90_vs_torch_flash"]
    print(bench.table(rows, cols))
    for s in sass:
        print("SASS:", s)
    plot(rows, bench.PLOTS / f"{a.plot}.png")
    print(f"wrote {path} and {bench.PLOTS / (a.plot + '.png')}")
    return 0


def plot(rows, path):
    plot_tflops_grid(rows, (("sm90_tflops", "C3", "cuflash sm90"), ("fa2_tflops", "C0", "cuflash FA-2"),
                            ("torch_cudnn_tflops", "C2", "cuDNN"), ("torch_flash_tflops", "C1", "torch FLASH")),
                     path, "TFLOP/s", "attention forward on Hopper, 16K tokens, hidden 2048")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
