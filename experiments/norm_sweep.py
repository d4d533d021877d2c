"""Norm bandwidth sweep: cuflash LayerNorm / RMSNorm against torch, a plain Triton norm and a copy, same run.

tokens x hidden for hidden 1K..32K at about ``--mib`` MiB of input (x), float32 and bfloat16; for each:
forward (``fwd``), fused residual forward (``fwd_res``: read x, r; write y, h) and backward (``bwd``: read dy,
x; write dx; dweight/dbias reduced in float32). GB/s always counts the bytes the *operation* must move
(cuflash.traffic.norm_bytes; backward 3 passes), so for one op every implementation's GB/s is a speed ratio;
torch's residual peer is its unfused ``x + r`` then norm, and its backward is autograd's. The copy
(read + write) is timed in the same run: ``frac_copy`` = GB/s / copy GB/s. Targets: forward >= 0.9 of copy,
backward >= 0.8, never slower than torch or Triton beside it. Errors, every implementation (cuflash, torch,
Triton): max abs and rel error of y (backward: dx) against the float64 reference (cuflash.reference) on sampled
rows; the backward's dweight / dbias as max abs error over the reference's largest magnitude, all rows.

    python experiments/norm_sweep.py [--quick] [--mib 256] [--hiddens 1024,...] [--dtypes float32,bfloat16]
    python experiments/norm_sweep.py --replot     # redraw plots/norm_bandwidth.png from the results JSON

Writes experiments/results/norm_sweep.json|csv and plots/norm_bandwidth.png (``--quick``: norm_sweep_quick.json|csv and
plots/norm_sweep_quick.png, so a smoke run never replaces the committed sweep). Without a GPU: one line, exit 2
(``--replot`` needs no GPU and exits 0).
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

from _common import (add_replot_arg, fill_defaults, int_list, load_results, name_list, nonnegative_int,  # noqa: E402
                     positive_float, positive_int, run_names)

import numpy as np  # noqa: E402

from cuflash import bench, traffic  # noqa: E402

OPS = ("fwd", "fwd_res", "bwd")
KINDS = ("layer", "rms")


FULL = {"mib": 256.0, "hiddens": "1024,2048,4096,8192,16384,32768"}
QUICK = {"mib": 64.0, "hiddens": "1024,8192,32768"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hiddens", type=int_list, default=None, help=f"default {FULL['hiddens']} (--quick: "
                    f"{QUICK['hiddens']})")
    ap.add_argument("--dtypes", type=name_list(("float32", "float16", "bfloat16")), default="float32,bfloat16")
    ap.add_argument("--kinds", type=name_list(KINDS), default="layer,rms")
    ap.add_argument("--ops", type=name_list(OPS), default=",".join(OPS))
    ap.add_argument("--mib", type=positive_float, default=None,
                    help=f"MiB of input x per case (default {FULL['mib']:g}; --quick: {QUICK['mib']:g})")
    ap.add_argument("--rep", type=positive_int, default=20)
    ap.add_argument("--warmup", type=nonnegative_int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke size (flags given explicitly are kept); results "
                    "named norm_sweep_quick, plot plots/norm_sweep_quick.png")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--name", default=None, help="results name (default norm_sweep; --quick: norm_sweep_quick)")
    ap.add_argument("--hold", default="on", choices=["on", "off", "all"],
                    help="cuflash.norm.HOLD: weights held in registers across rows (on), loaded per row (off), "
                         "every register chunk held with relaxed launch bounds (all)")
    add_replot_arg(ap, "norm_sweep")
    a = fill_defaults(ap.parse_args(argv), FULL, QUICK)
    a.plot = run_names(a, "norm_sweep", "norm_bandwidth")
    return a


def bwd_bytes(rows, hidden, dt, kind, weight=True):
    """Backward HBM bytes: read dy and x, write dx (3 passes), read weight and the float32 statistics."""
    s = np.dtype(dt).itemsize
    n = rows * hidden
    return 3 * n * s + int(weight) * hidden * s + rows * 4 * (2 if kind == "layer" else 1)


def host(a, sample=None):
    """A CuPy array or torch tensor (rows ``sample`` of it) as a float64 NumPy array."""
    if sample is not None:
        a = a[sample.tolist()] if hasattr(a, "detach") else a[sample]
    if hasattr(a, "detach"):  # torch: bfloat16 has no NumPy type
        return a.detach().float().cpu().numpy().astype(np.float64)
    return (a.get() if hasattr(a, "get") else np.asarray(a)).astype(np.float64)


def fwd_errors(out, ref):
    """max abs / rel error of a forward's sampled rows against the float64 reference."""
    e = bench.errors(host(out), ref)
    return {"max_abs_err": e["max_abs_err"], "max_rel_err": e["max_rel_err"]}


def bwd_reference(cp, kind, dy, x, w, mean, rstd, sample):
    """float64 references of a backward: dx on the sampled rows (cuflash.reference, given the saved float32
    statistics, as the op takes them), dweight and dbias over every row (on the GPU in float64: the sums need all
    rows)."""
    from cuflash import reference

    m = None if mean is None else mean[sample].get()
    if kind == "layer":
        dx = reference.layer_norm_backward(dy[sample].get(), x[sample].get(), w.get(), m, rstd[sample].get())[0]
    else:
        dx = reference.rms_norm_backward(dy[sample].get(), x[sample].get(), w.get(), rstd[sample].get())[0]
    d64 = dy.astype(cp.float64)
    xhat = x.astype(cp.float64)
    if mean is not None:
        xhat -= mean.astype(cp.float64)[:, None]
    xhat *= rstd.astype(cp.float64)[:, None]
    dw = (d64 * xhat).sum(0).get()
    db = d64.sum(0).get() if kind == "layer" else None
    del d64, xhat
    return dx, dw, db


def bwd_errors(grads, ref, sample):
    """A backward's errors: dx's max abs / rel error on the sampled rows (``max_abs_err``, ``max_rel_err``) and
    dweight's / dbias's max abs error over all columns relative to the reference's largest magnitude
    (``dweight_rel_err``, ``dbias_rel_err``: sums over every row, their scale grows with the rows)."""
    dx_ref, dw_ref, db_ref = ref
    e = bench.errors(host(grads[0], sample), dx_ref)
    out = {"max_abs_err": e["max_abs_err"], "max_rel_err": e["max_rel_err"]}
    for name, g, r in (("dweight", grads[1], dw_ref), ("dbias", grads[2] if len(grads) > 2 else None, db_ref)):
        if g is not None and r is not None:
            d = np.abs(host(g) - r)
            out[f"{name}_rel_err"] = float(np.max(np.where(np.isfinite(d), d, np.inf))) / max(
                float(np.abs(r).max()), 1e-30)
    return out


def to_dtype(cp, a32, dt):
    """float32 CuPy array -> dtype (bfloat16 by integer rounding if CuPy's astype refuses it)."""
    try:
        return a32.astype(dt)
    except Exception:  # pragma: no cover - depends on the CuPy version
        u = a32.view(cp.uint32)
        r = (u >> cp.uint32(16)) & cp.uint32(1)
        return ((u + cp.uint32(0x7FFF) + r) >> cp.uint32(16)).astype(cp.uint16).view(dt)


def triton_peers():
    """The plain one-row-per-program Triton norms of /work/shared/anchors/triton_probe.py (forward only)."""
    import triton
    import triton.language as tl

    @triton.jit
    def rms_k(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, (x * r * w).to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def ln_k(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.).to(tl.float32)
        mean = tl.sum(x, 0) / n_cols
        d = tl.where(mask, x - mean, 0.)
        r = tl.rsqrt(tl.sum(d * d, 0) / n_cols + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, (d * r * w + b).to(y_ptr.dtype.element_ty), mask=mask)

    def run(kind, x, w, b, y, eps):
        rows, hidden = x.shape
        B = triton.next_power_of_2(hidden)
        nw = min(32, max(4, B // 256))
        if kind == "layer":
            ln_k[(rows,)](x, w, b, y, hidden, eps, BLOCK=B, num_warps=nw)
        else:
            rms_k[(rows,)](x, w, y, hidden, eps, BLOCK=B, num_warps=nw)

    return run


def main(argv=None):
    a = parse_args(argv)
    if a.replot:
        doc = load_results(a.name)
        rows = doc["rows"]
        copy_gbps = doc["meta"].get("copy_GBps") or max(r["GBps"] for r in rows if r["impl"] == "copy")
        plot(rows, copy_gbps, None, list(dict.fromkeys(r["kind"] for r in rows)),
             list(dict.fromkeys(r["op"] for r in rows)), a.plot)
        return 0
    if not bench.has_gpu():
        print("norm_sweep: no CUDA device visible to CuPy; nothing to measure (run it on the GPU machine)")
        return 2
    import cupy as cp
    from tqdm import tqdm

    from cuflash import norm as _norm
    _norm.HOLD = {"on": True, "off": False, "all": "all"}[a.hold]

    import cuflash
    from cuflash import _dtypes, reference

    th = tri = None
    if not a.no_torch:
        try:
            import torch

            th = torch if torch.cuda.is_available() else None
        except Exception as e:  # pragma: no cover
            print("norm_sweep: torch peers skipped:", repr(e)[:200])
    if th is not None and not a.no_triton:
        try:
            tri = triton_peers()
        except Exception as e:  # pragma: no cover
            print("norm_sweep: Triton peer skipped:", repr(e)[:200])

    # copy bandwidth, same run (read + write of 1 GiB)
    copy_gbps = bench.copy_bandwidth(1 << 30, a.rep)
    print(f"copy: {copy_gbps:.0f} GB/s")

    hiddens = [int(h) for h in a.hiddens.split(",")]
    dtypes = [np.dtype(getattr(_dtypes, d)) for d in a.dtypes.split(",")]
    kinds = a.kinds.split(",")
    ops = a.ops.split(",")
    rows_out = []
    bar = tqdm(total=len(hiddens) * len(dtypes) * len(kinds) * len(ops), desc="norm_sweep", unit="case")
    rs = cp.random.RandomState(7)
    for dt in dtypes:
        dn = "bfloat16" if dt == _dtypes.bfloat16 else str(dt)
        for hidden in hiddens:
            tokens = max(1, int(a.mib * 2**20) // (hidden * dt.itemsize))
            x = to_dtype(cp, rs.standard_normal((tokens, hidden), dtype=cp.float32) * 2 + 1, dt)
            r = to_dtype(cp, rs.standard_normal((tokens, hidden), dtype=cp.float32), dt)
            dy = to_dtype(cp, rs.standard_normal((tokens, hidden), dtype=cp.float32), dt)
            w = to_dtype(cp, 1 + 0.1 * rs.standard_normal(hidden, dtype=cp.float32), dt)
            b = to_dtype(cp, 0.1 * rs.standard_normal(hidden, dtype=cp.float32), dt)
            sample = np.unique(np.r_[0, tokens - 1, np.arange(1, tokens, max(1, tokens // 6))])
            xs, rsm, ws, bs = x[sample].get(), r[sample].get(), w.get(), b.get()
            tx = tr = tdy = tw = tb = None
            shared = False  # the peers read cuflash's inputs (their errors are then measured too)
            if th is not None:
                try:
                    tx, tr, tdy, tw, tb = (th.from_dlpack(v) for v in (x, r, dy, w, b))
                    shared = True
                except Exception:  # pragma: no cover - DLPack without bfloat16: same-size data made by torch
                    tdt = th.bfloat16 if dt == _dtypes.bfloat16 else th.float32
                    tx, tr, tdy = (th.randn(tokens, hidden, device="cuda", dtype=tdt) for _ in range(3))
                    tw, tb = (th.randn(hidden, device="cuda", dtype=tdt) for _ in range(2))
            for kind in kinds:
                eps = 1e-5
                fn = cuflash.layer_norm if kind == "layer" else cuflash.rms_norm
                wb = (w, b) if kind == "layer" else (w,)
                if kind == "layer":
                    _, mean, rstd = fn(x, hidden, *wb, eps, return_stats=True)
                else:
                    mean, (_, rstd) = None, fn(x, hidden, *wb, eps, return_stats=True)
                for op in ops:
                    s = dt.itemsize
                    if op == "fwd":
                        nbytes = traffic.norm_bytes(tokens, hidden, dt, kind)
                    elif op == "fwd_res":
                        nbytes = traffic.norm_bytes(tokens, hidden, dt, kind, residual=True, fused=True)
                    else:
                        nbytes = bwd_bytes(tokens, hidden, dt, kind)
                    impls = {}
                    errs = {}  # impl -> {"max_abs_err": ..., ...} against float64 (bwd: dx, dweight, dbias)
                    if op == "fwd":
                        impls["cuflash"] = lambda: fn(x, hidden, *wb, eps)
                        ref = (reference.layer_norm(xs, (hidden,), ws, bs, eps) if kind == "layer"
                               else reference.rms_norm(xs, (hidden,), ws, eps))[0]
                        errs["cuflash"] = fwd_errors(impls["cuflash"]()[sample], ref)
                    elif op == "fwd_res":
                        impls["cuflash"] = lambda: fn(x, hidden, *wb, eps, residual=r)
                        hs = (xs.astype(np.float32) + rsm.astype(np.float32)).astype(dt)
                        ref = (reference.layer_norm(hs, (hidden,), ws, bs, eps) if kind == "layer"
                               else reference.rms_norm(hs, (hidden,), ws, eps))[0]
                        errs["cuflash"] = fwd_errors(impls["cuflash"]()[0][sample], ref)
                    else:
                        if kind == "layer":
                            impls["cuflash"] = lambda: cuflash.layer_norm_backward(dy, x, w, mean, rstd)
                        else:
                            impls["cuflash"] = lambda: cuflash.rms_norm_backward(dy, x, w, rstd)
                        ref = bwd_reference(cp, kind, dy, x, w, mean, rstd, sample)
                        errs["cuflash"] = bwd_errors(impls["cuflash"](), ref, sample)
                    impls["copy"] = None
                    if th is not None:
                        F = th.nn.functional
                        if op == "fwd":
                            impls["torch"] = ((lambda: F.layer_norm(tx, (hidden,), tw, tb, eps)) if kind == "layer"
                                              else (lambda: F.rms_norm(tx, (hidden,), tw, eps)))
                            errs["torch"] = fwd_errors(host(impls["torch"](), sample), ref) if shared else {}
                            if tri is not None:
                                ty = th.empty_like(tx)
                                impls["triton"] = (lambda ty=ty: tri(kind, tx, tw, tb, ty, eps))
                                if shared:
                                    impls["triton"]()
                                    errs["triton"] = fwd_errors(host(ty, sample), ref)
                        elif op == "fwd_res":
                            impls["torch"] = ((lambda: F.layer_norm(tx + tr, (hidden,), tw, tb, eps)) if kind == "layer"
                                              else (lambda: F.rms_norm(tx + tr, (hidden,), tw, eps)))
                            errs["torch"] = fwd_errors(host(impls["torch"](), sample), ref) if shared else {}
                        else:
                            txg = tx.detach().requires_grad_(True)
                            twg = tw.detach().requires_grad_(True)
                            tbg = tb.detach().requires_grad_(True)
                            yg = (F.layer_norm(txg, (hidden,), twg, tbg, eps) if kind == "layer"
                                  else F.rms_norm(txg, (hidden,), twg, eps))
                            params = (txg, twg, tbg) if kind == "layer" else (txg, twg)
                            impls["torch"] = (lambda yg=yg, params=params:
                                              th.autograd.grad(yg, params, tdy, retain_graph=True))
                            errs["torch"] = bwd_errors(impls["torch"](), ref, sample) if shared else {}
                    res = {}
                    for name, f in impls.items():
                        try:
                            if name == "copy":
                                # the same bytes as this op moves, as a device-to-device copy
                                buf = cp.empty(nbytes // 2, dtype=cp.uint8)
                                out = cp.empty_like(buf)
                                t = bench.time_cuda(lambda: cp.copyto(out, buf), warmup=a.warmup, rep=a.rep)
                                del buf, out
                            else:
                                t = bench.time_cuda(f, warmup=a.warmup, rep=a.rep)
                            res[name] = t["median_ms"]
                        except Exception as e:
                            print(f"norm_sweep: {name} {op} {kind} {dn} {hidden}: {type(e).__name__}: {e}"[:300])
                    for name, ms in res.items():
                        gbps = nbytes / (ms * 1e-3) / 1e9
                        row = {"op": op, "kind": kind, "dtype": dn, "tokens": tokens, "hidden": hidden, "impl": name,
                               "bytes": nbytes, "ms": ms, "GBps": gbps, "frac_copy": gbps / copy_gbps,
                               "frac_copy_same_size": res["copy"] / ms if "copy" in res else None}
                        for peer in ("torch", "triton"):
                            if name == "cuflash" and peer in res:
                                row[f"speed_vs_{peer}"] = res[peer] / ms
                        row.update(errs.get(name, {}))
                        rows_out.append(row)
                    c = res.get("cuflash")
                    if c:
                        print(f"{op:<8} {kind:<5} {dn:<8} {tokens:>7}x{hidden:<6} cuflash {nbytes / c / 1e6:7.0f} GB/s"
                              + "".join(f" | {k} {nbytes / v / 1e6:7.0f}" for k, v in res.items() if k != "cuflash"))
                    bar.update(1)
            del x, r, dy, tx, tr, tdy
    bar.close()
    meta = {"copy_GBps": copy_gbps, "args": vars(a),
            "note": "GBps = bytes the op must move / median time (torch fwd_res is its unfused x + r then norm; "
                    "its bwd is autograd); frac_copy = GBps / the 1 GiB copy of this run; frac_copy_same_size = "
                    "time of a copy of the op's bytes / the op's time"}
    path = bench.write_results(a.name, rows_out, meta)
    print("wrote", path)
    plot(rows_out, copy_gbps, dtypes, kinds, ops, a.plot)
    return 0


# one fixed colour / line style / marker per implementation, the same in every panel (and in the one legend)
IMPL_STYLE = {
    ("cuflash", "layer"): dict(color="C0", ls="-", marker="o", label="cuflash LayerNorm"),
    ("cuflash", "rms"): dict(color="C3", ls="-", marker="D", label="cuflash RMSNorm"),
    ("torch", "layer"): dict(color="C1", ls="--", marker="s", label="torch LayerNorm"),
    ("torch", "rms"): dict(color="C4", ls="--", marker="s", label="torch RMSNorm"),
    ("triton", "layer"): dict(color="C2", ls=":", marker="^", label="triton LayerNorm"),
    ("triton", "rms"): dict(color="C5", ls=":", marker="^", label="triton RMSNorm"),
    ("copy", None): dict(color="0.45", ls="-.", marker="x", label="copy of the op's bytes (same run)"),
}


def plot(rows, copy_gbps, dtypes, kinds, ops, stem="norm_bandwidth"):
    """GB/s against hidden, one panel per (dtype, op); ``dtypes`` is unused (the rows name them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    dnames = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(len(dnames), len(ops), figsize=(5 * len(ops), 3.6 * len(dnames) + 0.6),
                             squeeze=False)
    present = set()
    for i, dn in enumerate(dnames):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            for (impl, kind), st in IMPL_STYLE.items():
                if kind is not None and kind not in kinds:
                    continue
                sel = [r for r in rows if r["dtype"] == dn and r["op"] == op and r["impl"] == impl
                       and (kind is None or r["kind"] == kind)]
                if not sel:
                    continue
                by_h = {}
                for r in sel:  # the copy is timed once per kind: one point per hidden (mean of those)
                    by_h.setdefault(r["hidden"], []).append(r["GBps"])
                pts = sorted((h, float(np.mean(v))) for h, v in by_h.items())
                ax.plot(*zip(*pts), color=st["color"], ls=st["ls"], marker=st["marker"], ms=5, alpha=0.9)
                present.add((impl, kind))
            ax.axhline(copy_gbps, color="k", lw=0.8)
            ax.axhline(copy_gbps * (0.9 if op != "bwd" else 0.8), color="k", lw=0.6, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op} {dn}" + ("  (torch: unfused x + r, then norm)" if op == "fwd_res" else "")
                         + ("  (torch: autograd)" if op == "bwd" else ""), fontsize=9)
            ax.set_xlabel("hidden")
            ax.set_ylabel("GB/s (bytes the op must move)")
            ax.set_ylim(0, copy_gbps * 1.1)
            ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=st["color"], ls=st["ls"], marker=st["marker"], ms=5, label=st["label"])
               for key, st in IMPL_STYLE.items() if key in present]
    handles += [Line2D([], [], color="k", lw=0.8, label=f"copy, 1 GiB ({copy_gbps:.0f} GB/s)"),
                Line2D([], [], color="k", lw=0.6, ls=":", label="target (0.9 x copy fwd, 0.8 x copy bwd)")]
    fig.legend(handles=handles, loc="lower center", ncol=min(5, len(handles)), fontsize=8, frameon=False)
    fig.suptitle("LayerNorm / RMSNorm bandwidth, ~same input size per point (one colour per implementation, "
                 "all panels)")
    fig.tight_layout(rect=(0, 0.6 / (3.6 * len(dnames) + 0.6), 1, 1))
    bench.PLOTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(bench.PLOTS / f"{stem}.png", dpi=120)
    plt.close(fig)
    print("wrote", bench.PLOTS / f"{stem}.png")


if __name__ == "__main__":
    sys.exit(main())
