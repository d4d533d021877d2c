"""Modeled vs measured HBM bytes for every kernel of the toolkit (issue #7).

For one mid-size shape per kernel (inputs of 64-256 MiB, so the 60 MB L2 of an H200 cannot hold a whole
operand) this script puts the bytes the schedule must move (``cuflash.traffic``) next to the DRAM bytes Nsight
Compute counts (``dram__bytes_read.sum + dram__bytes_write.sum`` of every launch of the call, clocks left
alone, caches flushed before each kernel; all calls profiled in ONE ncu process by ``cuflash.ncu.measure_many``),
their ratio measured / modeled, and a note where they differ by more than 10 % (with the known reason: L2 hits on
re-reads, dQ atomics resolved in L2, lines still dirty in L2 when the kernel ends, passes the model leaves out).

Kernels: softmax (online default path at a short and a long row, safe, naive), log_softmax, logsumexp,
layer_norm, rms_norm, layer_norm with the fused residual add, layer_norm_backward, rms_norm_backward, attention
forward schedule="fa2", "fa1", "standard", "wgmma" (compute capability 9.0 only), attention_backward, and the
mixed-precision training kernels of ``cuflash.amp``: unscale_and_check (in place) and check_finite over a list of
bf16 and fp32 gradients (one launch per dtype), adamw_step and sgd_momentum_step on fp32 master weights and state
with a bf16 gradient and a bf16 model copy.

Writes experiments/results/traffic_check.json|csv (GPU, commit, command in the environment) and
plots/traffic_check.png (modeled and measured GB per kernel; measured against modeled, log-log, with y = x and
the +-10 % band). Without a GPU or without ncu (or with ``--predict``) it writes the model alone, labelled
PREDICTED, to traffic_check_predicted.json|csv and plots/traffic_check_predicted.png: with an explicit ``--predict``
in experiments/results (or ``--out``) and exit status 0; without a GPU or ncu in ``--out`` or a new temporary folder
it names (never into experiments/results) and exit status 2 (no measurement was made), as experiments/tile_sweep.py;
when ncu is there but fails, the same place and exit status 1. A ``--quick`` run names its files
traffic_check_quick[_predicted] (and its plot alike), never the committed full run's.

    python experiments/traffic_check.py [--quick] [--predict] [--gpu H200] [--out DIR] [--plots DIR]
    python experiments/traffic_check.py --replot [--predict] [--quick]   # redraw the plot from the results JSON
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    add_replot_arg, output_dirs, positive_float, predicted_watermark, print_results, pyplot, replot_recorded,
    save_figure, scratch_out)

import numpy as np  # noqa: E402

from cuflash import bench, gpus, ncu, traffic  # noqa: E402

NAME = "traffic_check"
TOL = 0.10
HOPPER = ("H100", "H200")  # GPU-table entries with compute capability 9.0 (the wgmma kernel)

# Known reasons a measurement leaves the model, per kernel group: (when measured < model, when measured > model).
# Shown only where the ratio is off by more than 10 %; None: no known reason (the generic note of ncu.compare).
# DIRTY-type reasons explain at most one L2 of bytes per launch (ncu counts the DRAM writes made during the
# kernel; lines still dirty when it ends are written back later, outside the measurement: the H200 anchor run
# measured 240 MB written by a 268 MB cupy fill); a larger deficit is reported as unexplained.
DIRTY = "output lines still dirty in L2 when the kernel ends are not counted (<= L2 per launch)"
FA1_DIRTY = "each of the T_c launches leaves O/m/l writes dirty in L2, not counted (<= L2 per launch)"
WHY = {
    "stream": (DIRTY, None),
    "split": (DIRTY, "the split path's second read of a chunk missed L2 (the model counts one read)"),
    "norm_bwd": ("the float32 partial sums (blocks x hidden) stay in L2 between the two kernels", None),
    "fa2": ("K/V re-reads by the Q tiles of a head hit L2 (the model counts every re-read)", None),
    "fa1": (FA1_DIRTY, None),
    "standard": ("S/P lines re-read from L2, dirty lines at kernel end not counted",
                 "cuflash's float32 casts of Q, K, V, O (CuPy elementwise kernels) are not modeled"),
    "bwd": ("dQ float32 atomics resolve in L2 (model: dQ_i read + written per tile pair, FA-2 Alg. 2)", None),
}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke size (inputs 4-32 MiB: L2 hides part of the traffic)")
    ap.add_argument("--predict", action="store_true", help="model only (no GPU, no ncu)")
    ap.add_argument("--gpu", default="H200", help="GPU table entry for the predicted mode (SMs, shared memory, cc)")
    ap.add_argument("--timeout", type=positive_float, default=540, help="seconds allowed for the one ncu process")
    ap.add_argument("--out", default=None, help="results folder (default experiments/results); plots go to "
                                                "OUT/plots unless --plots")
    ap.add_argument("--plots", default=None)
    add_replot_arg(ap, f"{NAME} (with --predict: {NAME}_predicted)")
    return ap.parse_args(argv)


def sizes(quick):
    """The shapes: softmax float32 rows x cols (short and long row), norms bf16 tokens x hidden, attention bf16
    (batch, heads, seqlen, head_dim), the AMP gradient list ((rows, cols, dtype) per tensor) and the optimizer
    parameter (rows, cols). Full size: softmax and norm inputs 256 MiB, attention q/k/v 64 MiB each, gradient list
    256 MiB (2 bf16 + 2 fp32 tensors), optimizer 64M parameters (fp32 master 256 MiB)."""
    if quick:
        return {"sm_short": (2048, 4096), "sm_long": (32, 262144), "norm": (4096, 4096), "attn": (1, 8, 2048, 128),
                "grads": ((1536, 4096, "bfloat16"), (512, 4096, "bfloat16"), (768, 4096, "float32"),
                          (256, 4096, "float32")),
                "param": (2048, 4096)}
    return {"sm_short": (16384, 4096), "sm_long": (256, 262144), "norm": (32768, 4096), "attn": (4, 16, 4096, 128),
            "grads": ((12288, 4096, "bfloat16"), (4096, 4096, "bfloat16"), (6144, 4096, "float32"),
                      (2048, 4096, "float32")),
            "param": (8192, 8192)}


class Device:
    """What the model needs to know about the GPU: SMs, opt-in shared memory, L2 size, whether the wgmma kernel
    runs, and (measured mode) the norm backward's block count. From the device when there is one, else the GPU
    table."""

    def __init__(self, gpu_name, real):
        self.real = real
        if real:
            import cupy as cp

            from cuflash import _compile

            dev = cp.cuda.runtime.getDevice()
            p = cp.cuda.runtime.getDeviceProperties(dev)
            self.sms = _compile.sm_count(dev)
            self.smem = _compile.max_shared_optin(dev)
            self.sm90 = (p["major"], p["minor"]) == (9, 0)
            self.name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            self.l2 = int(p["l2CacheSize"])
        else:
            g = gpus.get(gpu_name)
            self.sms, self.smem, self.sm90, self.name = g.sms, g.smem_optin_per_block, g.name in HOPPER, g.name
            self.l2 = g.l2_bytes

    def norm_bwd_blocks(self, kind, rows, hidden):
        """Partial-sum rows of cuflash's norm backward (its blocks, times the rows per block when streamed); None
        (the model's default) without a GPU."""
        if not self.real:
            return None
        try:  # cuflash.norm's private launch plan (BwdPlan: rows per block, max blocks, streamed or not)
            norm = importlib.import_module("cuflash.norm")
            from cuflash import _dtypes

            dt = np.dtype(_dtypes.bfloat16)
            cfg = norm._bwd_config(norm.LAYER if kind == "layer" else norm.RMS, dt, dt, hidden, True, 0)
            nb = max(1, min(math.ceil(rows / cfg.rpb), cfg.max_blocks))
            return nb * cfg.rpb if cfg.stream else nb
        except Exception as e:  # its layout changed: the model's default block count
            print(f"{NAME}: norm backward block count unknown ({type(e).__name__}: {e}); model default used")
            return None


def softmax_model(rows, cols, dtype, method, op, sms):
    """(bytes, path) of one softmax-family call: the path cuflash.softmax.plan picks, then its traffic model."""
    S = importlib.import_module("cuflash.softmax")
    pl = S.plan(np.dtype(dtype), rows, cols, op, method, sms=sms)
    if op == S.OP_LSE:
        return traffic.logsumexp_bytes(rows, cols, dtype, chunks=pl.chunks if pl.path == "stream" else 1), pl.path
    if pl.path == "split":
        return traffic.softmax_bytes(rows, cols, dtype, "split", splits=pl.chunks), pl.path
    sched = method if pl.path == "stream" else "cached"   # warp / block keep the row on chip
    return traffic.softmax_bytes(rows, cols, dtype, sched), pl.path


def fa1_tiles(head_dim, smem_limit):
    """The fa1 default tile: the first of FA1_DEFAULTS whose shared memory fits (as _attention_alt.fa1_tiles)."""
    alt = importlib.import_module("cuflash._attention_alt")
    return next(t for t in alt.FA1_DEFAULTS if alt.fa1_smem_bytes(head_dim, *t) <= smem_limit)


def cases(a, dev):
    """[(row, call source)]: every kernel with its shape, model and known deviation, and the code ncu runs."""
    S = importlib.import_module("cuflash.softmax")
    A = importlib.import_module("cuflash.attention")
    BW = importlib.import_module("cuflash.attention_bwd")
    sz = sizes(a.quick)
    out = []

    def add(kernel, variant, shape, dtype, nbytes, model, why, call):
        out.append(({"kernel": kernel, "variant": variant, "shape": shape, "dtype": dtype, "model_bytes": int(nbytes),
                     "model": model, "why": why}, call))

    R, C = sz["sm_short"]
    RL, CL = sz["sm_long"]
    for fn, x, r, c, method, op in (("softmax", "xs", R, C, "online", S.OP_SOFTMAX),
                                    ("softmax", "xl", RL, CL, "online", S.OP_SOFTMAX),
                                    ("softmax", "xs", R, C, "safe", S.OP_SOFTMAX),
                                    ("softmax", "xs", R, C, "naive", S.OP_SOFTMAX),
                                    ("log_softmax", "xs", R, C, "online", S.OP_LOG_SOFTMAX),
                                    ("logsumexp", "xs", R, C, "online", S.OP_LSE)):
        nb, path = softmax_model(r, c, "float32", method, op, dev.sms)
        model = ("logsumexp_bytes" if op == S.OP_LSE else
                 f"softmax_bytes({'split' if path == 'split' else method if path == 'stream' else 'cached'})")
        add(fn, f"{method} ({path})", f"{r}x{c}", "float32", nb, model, WHY["split" if path == "split" else "stream"],
            f"cuflash.{fn}({x}, axis=-1" + (f", method={method!r})" if method != "online" else ")"))

    T, H = sz["norm"]
    sh = f"{T}x{H}"
    add("layer_norm", "", sh, "bfloat16", traffic.norm_bytes(T, H, "bfloat16", "layer"), "norm_bytes(layer)",
        WHY["stream"], f"cuflash.layer_norm(xn, ({H},), w, b)")
    add("rms_norm", "", sh, "bfloat16", traffic.norm_bytes(T, H, "bfloat16", "rms"), "norm_bytes(rms)",
        WHY["stream"], f"cuflash.rms_norm(xn, ({H},), w)")
    add("layer_norm", "fused residual", sh, "bfloat16",
        traffic.norm_bytes(T, H, "bfloat16", "layer", residual=True, fused=True),
        "norm_bytes(layer, residual, fused)", WHY["stream"], f"cuflash.layer_norm(xn, ({H},), w, b, residual=rn)")
    for kind, call in (("layer", "cuflash.layer_norm_backward(dyn, xn, w, mean, rstd)"),
                       ("rms", "cuflash.rms_norm_backward(dyn, xn, w, rstd_r)")):
        nbk = dev.norm_bwd_blocks(kind, T, H)
        add(f"{kind}_norm_backward", f"{nbk} partial rows" if nbk else "", sh,
            "bfloat16", traffic.norm_backward_bytes(T, H, "bfloat16", kind, blocks=nbk),
            f"norm_backward_bytes({kind})", WHY["norm_bwd"], call)

    B, Hh, N, d = sz["attn"]
    sh = f"B{B} H{Hh} N{N} d{d}"
    br, bc, _ = A.DEFAULT_TILES[(d, False)]
    add("attention", f"fa2 {br}x{bc}", sh, "bfloat16",
        traffic.attention_bytes("fa2", B, Hh, N, N, d, br, bc, "bfloat16"), "attention_bytes(fa2)", WHY["fa2"],
        "cuflash.attention(q, k, v, schedule='fa2')")
    br1, bc1 = fa1_tiles(d, dev.smem)
    add("attention", f"fa1 {br1}x{bc1}", sh, "bfloat16",
        traffic.attention_bytes("fa1", B, Hh, N, N, d, br1, bc1, "bfloat16"), "attention_bytes(fa1)", WHY["fa1"],
        "cuflash.attention(q, k, v, schedule='fa1')")
    s_path = softmax_model(B * Hh * N, N, "float32", "online", S.OP_SOFTMAX, dev.sms)[1]
    add("attention", "standard (S, P float32)", sh, "bfloat16",
        traffic.attention_bytes("standard", B, Hh, N, N, d, None, None, "bfloat16", score_dtype="float32",
                                softmax="cached" if s_path in ("warp", "block") else "online"),
        "attention_bytes(standard)", WHY["standard"], "cuflash.attention(q, k, v, schedule='standard')")
    if dev.sm90:
        sm90 = importlib.import_module("cuflash._attention_sm90")
        wbr, wbc, _ = sm90.TILES[(sm90.pick_variant(None, d), d)][0]
        add("attention", f"wgmma {wbr}x{wbc}", sh, "bfloat16",
            traffic.attention_bytes("fa2", B, Hh, N, N, d, wbr, wbc, "bfloat16"), "attention_bytes(fa2)", WHY["fa2"],
            "cuflash.attention(q, k, v, schedule='wgmma')")
    bbc = BW.DEFAULT_BC[d]
    add("attention_backward", f"fa2 {BW.BM}x{bbc}, dQ atomics", sh, "bfloat16",
        traffic.attention_backward_bytes(B, Hh, N, N, d, BW.BM, bbc, "bfloat16"), "attention_backward_bytes",
        WHY["bwd"], "cuflash.attention_backward(do, q, k, v, o, lse)")

    # mixed-precision training: one streaming pass each (every element read once, written once)
    grads = sz["grads"]
    gn, gdt = [r * c for r, c, _ in grads], [dt for _, _, dt in grads]
    by_dt = {dt: [(r, c) for r, c, d in grads if d == dt] for dt in dict.fromkeys(gdt)}
    sh = "/".join(f"({'+'.join(str(r) for r, _ in v)})x{v[0][1]}" if len({c for _, c in v}) == 1 else
                   "+".join(f"{r}x{c}" for r, c in v) for v in by_dt.values())   # (12288+4096)x4096/...
    gdts = "/".join(by_dt)
    add("unscale_and_check", f"{len(grads)} tensors, {len(by_dt)} launches", sh, gdts,
        traffic.unscale_and_check_bytes(gn, gdt), "unscale_and_check_bytes", WHY["stream"],
        "cuflash.amp.unscale_and_check(gl, 0.5, fi)")
    add("unscale_and_check", "check_finite (write=False)", sh, gdts,
        traffic.unscale_and_check_bytes(gn, gdt, write=False), "unscale_and_check_bytes(write=False)",
        (None, None), "cuflash.amp.check_finite(gl, fi)")
    P, Q = sz["param"]
    n = P * Q
    sh = f"{P}x{Q}"
    add("adamw_step", "bf16 grad+model, fp32 master+m+v", sh, "bfloat16/float32",
        traffic.adamw_step_bytes(n, "bfloat16", "bfloat16", skip_flag=True), "adamw_step_bytes", WHY["stream"],
        "cuflash.amp.adamw_step(pm, pg, pa, pv, pmod, lr=1e-3, step=10, found_inf=fz)")
    add("sgd_momentum_step", "momentum 0.9, bf16 grad+model", sh, "bfloat16/float32",
        traffic.sgd_momentum_step_bytes(n, "bfloat16", "bfloat16", momentum=0.9, skip_flag=True),
        "sgd_momentum_step_bytes", WHY["stream"],
        "cuflash.amp.sgd_momentum_step(pm, pg, pb, pmod, lr=1e-3, momentum=0.9, found_inf=fz)")
    return out


def setup_code(a):
    """The inputs every call reads (allocated once, outside the profiled range), and the forward outputs the
    backward passes need."""
    sz = sizes(a.quick)
    R, C = sz["sm_short"]
    RL, CL = sz["sm_long"]
    T, H = sz["norm"]
    B, Hh, N, d = sz["attn"]
    P, Q = sz["param"]
    grads = ", ".join(f"rnd({r}, {c}, dt={'bf' if dt == 'bfloat16' else 'cupy.' + dt})" for r, c, dt in sz["grads"])
    return "\n".join([
        "import cuflash",
        "from cuflash._attention_alt import from_float32",
        "bf = cuflash._dtypes.bfloat16",
        "rs = cupy.random.RandomState(7)",
        "def rnd(*shape, dt=bf):",
        "    x = rs.standard_normal(shape, dtype=cupy.float32)",
        "    return x if dt == cupy.float32 else from_float32(x, dt)",
        f"xs = rnd({R}, {C}, dt=cupy.float32)",
        f"xl = rnd({RL}, {CL}, dt=cupy.float32)",
        f"xn, rn, dyn = rnd({T}, {H}), rnd({T}, {H}), rnd({T}, {H})",
        f"w, b = from_float32(1 + 0.1 * rs.standard_normal({H}, dtype=cupy.float32), bf), rnd({H})",
        f"_, mean, rstd = cuflash.layer_norm(xn, ({H},), w, b, return_stats=True)",
        f"_, rstd_r = cuflash.rms_norm(xn, ({H},), w, return_stats=True)",
        f"q, k, v, do = (rnd({B}, {Hh}, {N}, {d}) for _ in range(4))",
        "o, lse = cuflash.attention(q, k, v, schedule='fa2', return_lse=True)",
        f"gl = [{grads}]",
        "fi, fz = cupy.zeros((), cupy.int32), cupy.zeros((), cupy.int32)",
        f"pm, pg, pmod = rnd({P}, {Q}, dt=cupy.float32), rnd({P}, {Q}), rnd({P}, {Q})",
        f"pa, pv, pb = (cupy.zeros(({P}, {Q}), cupy.float32) for _ in range(3))",
        "cupy.cuda.Device().synchronize()",
    ])


def finish_row(row, meas, predicted, gpu_name, l2_bytes=60 << 20):
    """Add GB, ratio, flag and note to a case row (``meas``: a measure_many result or None)."""
    row["modeled_gb"] = row["model_bytes"] / 1e9
    why = row.pop("why")
    if predicted:
        row.update(mode="predicted", predicted_for=gpu_name)
        return row
    row["mode"] = "measured"
    if meas is None or meas.get("error"):
        row.update(measured_gb=None, ratio=None, flag="", model_note="",
                   error=(meas or {}).get("error") or "not measured")
        return row
    c = ncu.compare(meas["bytes"], row["model_bytes"], TOL)
    row.update(measured_bytes=c["measured_bytes"], measured_gb=meas["bytes"] / 1e9,
               read_gb=meas["read_bytes"] / 1e9, write_gb=meas["write_bytes"] / 1e9, ratio=c["measured_over_modeled"],
               n_launches=meas["n_launches"],
               kernels="; ".join(dict.fromkeys(str(x.get("kernel", ""))[:80] for x in meas["launches"])))
    r = c["measured_over_modeled"]
    off = r is not None and abs(r - 1) > TOL
    row["flag"] = ">10%" if off else ""
    known = (why[0] if r < 1 else why[1]) if off else None
    if known in (DIRTY, FA1_DIRTY) and row["model_bytes"] - meas["bytes"] > l2_bytes * max(meas["n_launches"], 1):
        known = "more than dirty L2 lines can explain: check the model and the kernel"
    row["model_note"] = (f"measured {r:.2f}x model: {known}" if known else c["model_note"]) if off else ""
    return row


def run(a, plots, predicted):
    dev = Device(a.gpu, real=not predicted)
    todo = cases(a, dev)
    meas = [None] * len(todo)
    ncu_error = None
    if not predicted:
        print(f"{NAME}: profiling {len(todo)} calls in one ncu process (timeout {a.timeout:.0f} s) ...")
        try:
            meas = ncu.measure_many(setup_code(a), [c for _, c in todo], timeout=a.timeout)
        except ncu.NcuUnavailable as e:
            ncu_error = str(e)
            print(f"{NAME}: ncu failed, writing the model alone (PREDICTED); ncu said:\n{ncu_error[-1500:]}")
            predicted = True
            if a.out is None:  # not over experiments/results
                scratch_out(a, NAME)
                plots = output_dirs(a)
    rows = [finish_row(dict(r, call=c), m, predicted, dev.name, dev.l2) for (r, c), m in zip(todo, meas)]
    name = NAME + ("_quick" if a.quick else "") + ("_predicted" if predicted else "")  # --quick: never the committed
    meta = {"predicted": predicted, "gpu_table": dev.name if predicted else None,
            "tolerance": TOL, "args": vars(a), "ncu_error": ncu_error,
            "measured": "ncu dram__bytes_read.sum + dram__bytes_write.sum summed over the launches of each call "
                        "(cuflash.ncu.measure_many: one process, marker kernels between calls, --clock-control "
                        "none, caches flushed before every kernel)",
            "model": "cuflash.traffic (column 'model'): the bytes each schedule moves, no credit for L2 hits",
            "note": (f"PREDICTED for {dev.name}: traffic model only, nothing measured" if predicted else
                     "measured / modeled HBM bytes per kernel; flag '>10%' where they differ by more than 10%")}
    path = bench.write_results(name, rows, meta)
    label = f"PREDICTED for {dev.name} (model, no GPU)" if predicted else f"{dev.name} (measured with ncu)"
    plot(rows, plots / f"{name}.png", label)
    return path, rows, predicted


def plot(rows, path, label):
    """(a) modeled and measured GB per kernel (log scale); (b) measured vs modeled, log-log, y = x and +-10 %."""
    plt = pyplot()

    names = [f"{r['kernel']} {r.get('variant') or ''}".strip() for r in rows]
    mod = np.array([r["model_bytes"] / 1e9 for r in rows])
    mea = np.array([r.get("measured_gb") or np.nan for r in rows], dtype=float)
    have = np.isfinite(mea)
    fig, axes = plt.subplots(1, 2, figsize=(15, max(5, 0.5 * len(rows) + 1.5)),
                             gridspec_kw={"width_ratios": [1.3, 1]})
    ax = axes[0]
    y = np.arange(len(rows))
    ax.barh(y - 0.2, mod, 0.4, color="tab:orange", label="modeled (cuflash.traffic)")
    if have.any():
        ax.barh(y + 0.2, np.where(have, mea, 0), 0.4, color="tab:blue", label="measured (ncu DRAM bytes)")
        for i in np.nonzero(have)[0]:
            ax.text(max(mod[i], mea[i]) * 1.08, y[i], f"{mea[i] / mod[i]:.2f}x", va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{n}\n[{r['shape']} {r.get('dtype', '')}]" for n, r in zip(names, rows)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("HBM GB per call")
    ax.set_title("bytes per kernel", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=2, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax = axes[1]
    lo, hi = mod.min() / 2, mod.max() * 2
    if have.any():
        lo, hi = min(lo, np.nanmin(mea) / 2), max(hi, np.nanmax(mea) * 2)
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, "k-", lw=1, label="measured = modeled")
    ax.fill_between(xs, xs * (1 - TOL), xs * (1 + TOL), color="gray", alpha=0.25, label="+-10 %")
    if have.any():
        off = np.array([bool(r.get("flag")) for r in rows])
        ax.scatter(mod[have & ~off], mea[have & ~off], color="tab:green", s=25, zorder=3, label="within 10 %")
        ax.scatter(mod[have & off], mea[have & off], color="tab:red", s=25, zorder=3, label="off by > 10 %")
        for i in np.nonzero(have)[0]:
            short = " ".join(names[i].split()[:2])
            ax.annotate(short, (mod[i], mea[i]), fontsize=6, xytext=(4, -3), textcoords="offset points")
    else:
        ax.text(0.5, 0.5, "no measurement\n(model only)", transform=ax.transAxes, ha="center", va="center",
                fontsize=12, color="gray")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("modeled GB")
    ax.set_ylabel("measured GB (ncu)")
    ax.set_title("measured vs modeled", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"Modeled vs measured HBM bytes per kernel — {label}", fontsize=11)
    predicted_watermark(fig, label)
    save_figure(fig, path, dpi=110)


def replot(a, plots) -> int:
    """Redraw plots/traffic_check.png (traffic_check_predicted.png with --predict; traffic_check_quick*.png with
    --quick) from the results JSON."""
    return replot_recorded(a, plots, NAME + ("_quick" if a.quick else ""), plot, "model", "measured with ncu")


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.replot:
        return replot(a, output_dirs(a))
    forced = None
    if not a.predict:
        if not bench.has_gpu():
            forced = f"{NAME}: no CUDA device: writing the traffic model alone for {a.gpu} (PREDICTED)"
        elif not ncu.available():
            forced = f"{NAME}: ncu not found (or CUFLASH_NO_NCU set): writing the traffic model alone (PREDICTED)"
    if forced:
        print(forced)
        scratch_out(a, NAME)
    plots = output_dirs(a)
    path, rows, predicted = run(a, plots, predicted=a.predict or forced is not None)
    print_results(path, rows, ("kernel", "variant", "shape", "dtype", "modeled_gb", "measured_gb", "ratio", "flag",
                               "n_launches", "error"))
    for r in rows:
        if r.get("model_note"):
            print(f"  {r['kernel']} {r['variant']}".rstrip() + f": {r['model_note']}")
    if a.predict:
        return 0
    if forced:
        return 2
    return 1 if predicted else 0   # predicted here: ncu itself failed


if __name__ == "__main__":
    sys.exit(main())
