"""Softmax bandwidth sweep: rows x cols at about 256 MiB of input, cuflash against torch, cupyx, Triton and a copy.

Row lengths 1K <= cols <= 1M, float32 / float16 / bfloat16, each cuflash method (online, safe, naive), with the
peers timed in the same run: torch.softmax, cupyx.scipy.special.softmax, a plain Triton row softmax (the kernel of
shared/anchors/triton_probe.py, copied below) and a device-to-device copy (the ceiling); and log_softmax (cuflash
online, torch.log_softmax; --no-log leaves it out).

GB/s counts the bytes a softmax must move at the least: the input read once and the output written once
(2·rows·cols·itemsize), whatever the method really moves (safe reads 3x, stream-path online 2x). Errors are
max relative errors against float64 scipy on the first rows. Also measured: host overhead per call on a small
input (8 x 1024 float32, 2000 calls, one sync).

Writes experiments/results/softmax_sweep.{json,csv} and plots/softmax_bandwidth.png; a --quick run (64 MiB,
4 row lengths, 5 repetitions unless given) writes softmax_sweep_quick.{json,csv} and plots/softmax_sweep_quick.png,
and a run under another --name writes <name>.{json,csv} and plots/<name>.png. Without a GPU: one line, exit 2.

    python experiments/softmax_sweep.py [--quick] [--mib 256] [--cols 1024,...] [--dtypes float32,...]
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:  # experiments/_common.py (also when loaded from file)
    sys.path.insert(0, str(ROOT / "experiments"))

from _common import (  # noqa: E402
    default_help, fill_defaults, int_list, name_list, nonnegative_int, positive_int, run_names)

import numpy as np  # noqa: E402

from cuflash import bench, reference  # noqa: E402
from cuflash import _dtypes  # noqa: E402

sm = importlib.import_module("cuflash.softmax")

COLS = [1 << k for k in range(10, 21)]  # 1K .. 1M
METHODS = ("online", "safe", "naive")
TRITON_MAX_COLS = 65536
TUNE = [{"chunk_slots": 4096}, {"lag": 132}, {"lag": 528}, {"lag": 1056}, {"chunk_slots": 4096, "lag": 132},
        {"split": "registers"}, {"single_read": False},
        {"cluster": 0},  # the planner without the cluster path (block / split), for comparison
        {"path": "cluster", "cluster": 2}, {"path": "cluster", "cluster": 4},  # the cluster split (cc >= 9.0)
        {"path": "cluster", "cluster": 8}]  # a one-row-per-program kernel: the row must fit on chip


DTYPES = ("float32", "float16", "bfloat16")
FULL = {"mib": 256, "cols": ",".join(map(str, COLS)), "rep": 20}
QUICK = {"mib": 64, "cols": "1024,16384,65536,1048576", "rep": 5}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=positive_int, help=default_help("input size per shape in MiB", "mib", FULL, QUICK))
    ap.add_argument("--cols", type=int_list, help=default_help("row lengths", "cols", FULL, QUICK))
    ap.add_argument("--dtypes", type=name_list(DTYPES), default=",".join(DTYPES),
                    help=f"comma-separated, of {', '.join(DTYPES)} (default all)")
    ap.add_argument("--methods", type=name_list(METHODS), default=",".join(METHODS),
                    help=f"comma-separated cuflash methods, of {', '.join(METHODS)} (default all)")
    ap.add_argument("--rep", type=positive_int, help=default_help("timed repetitions", "rep", FULL, QUICK))
    ap.add_argument("--warmup", type=nonnegative_int, default=3)
    ap.add_argument("--no-peers", action="store_true", help="skip torch / cupyx / triton")
    ap.add_argument("--no-log", action="store_true", help="skip log_softmax (cuflash and torch)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: changes the defaults of --mib, --cols, --rep (not what is given); writes "
                         "softmax_sweep_quick unless --name")
    ap.add_argument("--name", default=None,
                    help="results file stem (default softmax_sweep; softmax_sweep_quick with --quick); the plot "
                         "is plots/softmax_bandwidth.png for softmax_sweep, else plots/<name>.png")
    ap.add_argument("--tune", action="store_true", help="also time the online method under other partitions")
    a = fill_defaults(ap.parse_args(argv), FULL, QUICK)
    a.plot = run_names(a, "softmax_sweep", "softmax_bandwidth")
    return a


def _triton_softmax():
    """The Triton row softmax of shared/anchors/triton_probe.py (persistent, one row per program, row on chip)."""
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_k(x_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0)
        for row in tl.range(pid, n_rows, step):
            offs = tl.arange(0, BLOCK)
            mask = offs < n_cols
            x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
            m = tl.max(x, 0)
            e = tl.exp(x - m)
            s = tl.sum(e, 0)
            tl.store(y_ptr + row * n_cols + offs, (e / s).to(y_ptr.dtype.element_ty), mask=mask)

    def run(x, y, sms):
        rows, cols = x.shape
        B = triton.next_power_of_2(cols)
        softmax_k[(min(rows, sms * 4),)](x, y, rows, cols, BLOCK=B, num_warps=8 if B <= 8192 else 16)

    return run


def _inputs(rows, cols, dname, torch):
    """The same data as a CuPy array and (when torch is there) a torch tensor sharing its memory."""
    import cupy as cp

    dt = getattr(_dtypes, dname)
    x32 = cp.random.standard_normal((rows, cols), dtype=cp.float32)
    x = x32.astype(dt)
    del x32
    t = None
    if torch is not None:
        if dname == "bfloat16":
            t = torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
        else:
            t = torch.from_dlpack(x)
    return x, t


def host_overhead(torch):
    """Microseconds per call on 8 x 1024 float32 (2000 calls, one sync), next to a bare RawKernel launch."""
    import cupy as cp
    import cupyx.scipy.special as cxs

    import cuflash

    x = cp.random.standard_normal((8, 1024), dtype=cp.float32)
    bare = cp.RawKernel(r'extern "C" __global__ void k(const float* x, float* y, long long n) {'
                        r' if (threadIdx.x == 0 && blockIdx.x == 0 && n < 0) y[0] = x[0]; }', "k")
    y = cp.empty_like(x)
    fns = {"cuflash.softmax": lambda: cuflash.softmax(x, axis=-1),
           "cuflash.logsumexp": lambda: cuflash.logsumexp(x, axis=-1),
           "bare RawKernel launch": lambda: bare((8,), (256,), (x, y, np.int64(8192))),
           "cupyx.scipy.special.softmax": lambda: cxs.softmax(x, axis=-1)}
    if torch is not None:
        t = torch.from_dlpack(x)
        fns["torch.softmax"] = lambda: torch.softmax(t, -1)
    return {name: bench.host_us_per_call(f) for name, f in fns.items()}


def main(argv=None) -> int:
    a = parse_args(argv)
    if not bench.has_gpu():
        print("softmax_sweep: no CUDA device visible to CuPy; nothing to measure (run it on the GPU machine)")
        return 2
    run(a)
    return 0


def run(a):
    """The sweep of ``a`` (parse_args's namespace): writes the results and the plot, returns the rows."""
    import cupy as cp

    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    tri = None
    if not a.no_peers and torch is not None:
        try:
            tri = _triton_softmax()
        except Exception as e:  # pragma: no cover
            print("triton peer unavailable:", repr(e))
    env = bench.environment()
    sms = env.get("sm_count") or 132
    nbytes = a.mib << 20
    copy_gbps = copy_bandwidth(nbytes, a.rep)
    print(f"device-to-device copy: {copy_gbps:.0f} GB/s")
    rows_out = []
    for dname in a.dtypes.split(","):
        dt = getattr(_dtypes, dname)
        s = dt.itemsize
        for cols in [int(c) for c in a.cols.split(",")]:
            rows = max(1, nbytes // (cols * s))
            x, t = _inputs(rows, cols, dname, None if a.no_peers else torch)
            useful = 2 * rows * cols * s
            ref = reference.softmax(x[:2].get(), axis=-1)
            ref_log = None if a.no_log else reference.log_softmax(x[:2].get(), axis=-1)
            base = {"dtype": dname, "rows": rows, "cols": cols, "bytes_useful": useful, "copy_GBps": copy_gbps}

            def record(impl, fn, method="", plan=None, ref=ref):
                r = dict(base, impl=impl, method=method)
                try:
                    y = fn()
                    if hasattr(y, "__cuda_array_interface__") and not isinstance(y, cp.ndarray):
                        y = cp.asarray(y) if y.dtype != torch.bfloat16 else cp.from_dlpack(
                            y.view(torch.int16)).view(_dtypes.bfloat16)
                    e = bench.errors(y[:2], ref)
                    r.update(max_rel_err=e["max_rel_err"], max_abs_err=e["max_abs_err"])
                    del y
                    ms = bench.time_cuda(fn, warmup=a.warmup, rep=a.rep)["median_ms"]
                    r.update(ms=ms, GBps=useful / (ms * 1e-3) / 1e9)
                    r["frac_of_copy"] = r["GBps"] / copy_gbps
                    if plan is not None:
                        r.update(path=plan.path, threads=plan.threads, chunks=plan.chunks, copy=plan.copy)
                except Exception as ex:
                    r["error"] = f"{type(ex).__name__}: {ex}"[:300]
                    print(f"{impl} {method} {dname} {rows}x{cols}: {r['error']}")
                rows_out.append(r)
                return r

            for method in a.methods.split(","):
                _, pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, method, None, return_plan=True)
                record("cuflash", lambda m=method: sm.softmax(x, axis=-1, method=m), method, pl)
            if not a.no_log:
                _, pl = sm._softmax_impl(x, -1, sm.OP_LOG_SOFTMAX, "online", None, return_plan=True)
                record("cuflash.log_softmax", lambda: sm.log_softmax(x, axis=-1), "online", pl, ref=ref_log)
            for part in (TUNE if a.tune else ()):
                try:
                    _, pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", part, return_plan=True)
                except Exception as ex:
                    print("tune", part, ex)
                    continue
                record("cuflash-tune", lambda p=part: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p),
                       repr(part), pl)
            if not a.no_peers:
                if t is not None:
                    record("torch.softmax", lambda: torch.softmax(t, -1))
                    if not a.no_log:
                        record("torch.log_softmax", lambda: torch.log_softmax(t, -1), ref=ref_log)
                if tri is not None and cols <= TRITON_MAX_COLS and t is not None:
                    ty = torch.empty_like(t)
                    record("triton", lambda: _tri_out(tri, t, ty, sms))
                import cupyx.scipy.special as cxs

                try:
                    record("cupyx.scipy.special.softmax", lambda: cxs.softmax(x, axis=-1))
                except Exception as ex:  # pragma: no cover
                    print("cupyx:", ex)
            line = [f"{dname:9s} {rows:7d}x{cols:<8d}"]
            for r in rows_out:
                if r["dtype"] == dname and r["cols"] == cols and r.get("GBps"):
                    name = r["impl"] if "log" in r["impl"] else r["impl"].split(".")[0]
                    line.append(f"{name}{'/' + r['method'] if r['method'] else ''} {r['GBps']:.0f}")
            print("  ".join(line), flush=True)
    ho = host_overhead(None if a.no_peers else torch)
    print("host overhead per call (us):", {k: round(v, 2) for k, v in ho.items()})
    summary = _summary(rows_out, copy_gbps)
    meta = {"mib": a.mib, "copy_GBps": copy_gbps, "host_overhead_us": ho, "summary": summary,
            "gbps_counts": "bytes read + bytes written once (2 * rows * cols * itemsize)",
            "triton_kernel": "shared/anchors/triton_probe.py softmax_k, copied"}
    path = bench.write_results(a.name, rows_out, meta)
    print("wrote", path)
    _table(rows_out)
    plot(rows_out, copy_gbps, bench.PLOTS / f"{a.plot}.png", a.mib)
    return rows_out


copy_bandwidth = bench.copy_bandwidth  # (the scratch probes reach it here)


def _tri_out(tri, t, ty, sms):
    tri(t, ty, sms)
    return ty


def _summary(rows, copy_gbps):
    """Per dtype and row length: online GB/s, its fraction of copy, and whether it beats torch and triton."""
    out = []
    keys = sorted({(r["dtype"], r["cols"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for d, c in keys:
        g = {(r["impl"], r["method"]): r.get("GBps") for r in rows if r["dtype"] == d and r["cols"] == c}
        on = g.get(("cuflash", "online"))
        if on is None:
            continue
        th, tr = g.get(("torch.softmax", "")), g.get(("triton", ""))
        out.append({"dtype": d, "cols": c, "online_GBps": on, "frac_of_copy": on / copy_gbps,
                    "torch_GBps": th, "triton_GBps": tr, "vs_torch": on / th if th else None,
                    "vs_triton": on / tr if tr else None,
                    "target_met": bool(on >= 0.9 * copy_gbps and (not th or on >= th) and (not tr or on >= tr))})
    return out


def _table(rows):
    cols = sorted({r["cols"] for r in rows})
    for d in sorted({r["dtype"] for r in rows}):
        print(f"\n{d}: GB/s (read + write once)")
        impls = [("cuflash", m) for m in METHODS] + [("torch.softmax", ""), ("triton", ""),
                                                     ("cupyx.scipy.special.softmax", ""),
                                                     ("cuflash.log_softmax", "online"), ("torch.log_softmax", "")]
        print(f"{'impl':32s}" + "".join(f"{c:>9d}" for c in cols))
        for imp in impls:
            vals = {r["cols"]: r.get("GBps") for r in rows if r["dtype"] == d and (r["impl"], r["method"]) == imp}
            if any(vals.values()):
                print(f"{(imp[0] + ' ' + imp[1]).strip():32s}" +
                      "".join(f"{vals[c]:9.0f}" if vals.get(c) else f"{'-':>9s}" for c in cols))


def plot(rows, copy_gbps, path, mib=256):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    colors = {"float32": "C0", "float16": "C1", "bfloat16": "C2"}
    styles = {("cuflash", "online"): ("-", "o", 2.2), ("cuflash", "safe"): ("--", "s", 1.2),
              ("cuflash", "naive"): (":", "^", 1.2), ("torch.softmax", ""): ("-.", "x", 1.0),
              ("triton", ""): ((0, (1, 1)), "d", 1.0), ("cupyx.scipy.special.softmax", ""): ((0, (5, 5)), "v", 0.8)}
    for d in colors:
        for key, (ls, mk, lw) in styles.items():
            pts = sorted((r["cols"], r["GBps"]) for r in rows
                         if r["dtype"] == d and (r["impl"], r["method"]) == key and r.get("GBps"))
            if not pts:
                continue
            label = f"{key[0].replace('cuflash', 'cuflash ' + key[1]).replace('.scipy.special', '')} {d}"
            ax.plot(*zip(*pts), ls=ls, marker=mk, lw=lw, ms=4, color=colors[d], label=label,
                    alpha=1.0 if key[0] == "cuflash" else 0.6)
    ax.axhline(copy_gbps, color="k", lw=1.5, label=f"device copy {copy_gbps:.0f} GB/s")
    ax.axhline(0.9 * copy_gbps, color="k", lw=0.8, ls="--", label="90% of copy (target)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"row length (columns); rows = {mib} MiB / (cols x itemsize)")
    ax.set_ylabel("GB/s (bytes read + written once)")
    env = bench.environment()
    ax.set_title(f"Row softmax bandwidth on {env.get('gpu')} (cuflash {env.get('commit')})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
