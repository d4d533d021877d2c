"""Norm launch-shape study: the same kernels under different row-to-thread mappings, a copy in the same run.

The norms are memory-bound; how rows map to threads decides how many bytes each SM keeps in flight and whether
one block's load phase overlaps another's reduction and store. This script times every setting of the
module-level knobs of ``cuflash.norm`` at about ``--mib`` MiB of input and prints GB/s and the fraction of
the copy bandwidth, so the defaults can be chosen from measurements:

- forward: ``STREAM`` (the cp.async-staged kernel for rows of at least ``STREAM_MIN_VECS`` 16-byte vectors,
  with ``STREAM_VECS_PER_THREAD`` vectors per thread on its block path), and for the register kernel
  ``WARP_ROWS`` (rows per block on the warp-per-row path; 1: a one-warp block per row, 0: the path off, block path) and
  ``FWD_MAX_THREADS`` (threads per row on the block path);
- backward: ``BWD_MAX_THREADS`` (threads per row; fewer threads = more independent blocks per SM).

    python experiments/norm_tune.py [--mib 256] [--hiddens 1024,...] [--dtypes float32,bfloat16] [--quick]

Writes experiments/results/norm_tune.json|csv. Without a GPU: one line, exit 2.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from cuflash import bench, norm, traffic  # noqa: E402

FWD_KNOBS = ("STREAM", "STREAM_MIN_VECS", "STREAM_VECS_PER_THREAD", "WARP_ROWS", "FWD_MAX_THREADS")
FWD_SETTINGS = [(False, 0, 4, 8, 512), (False, 0, 4, 8, 256), (True, 0, 4, 8, 512), (True, 0, 8, 8, 512),
                (True, 0, 2, 8, 512),
                # the warp-per-row path with fewer rows (warps) per block: more, smaller blocks per SM
                (False, 0, 4, 4, 512), (False, 0, 4, 2, 512), (False, 0, 4, 1, 512)]
BWD_SETTINGS = [512, 256, 128]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hiddens", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--kinds", default="layer,rms")
    ap.add_argument("--mib", type=float, default=256.0)
    ap.add_argument("--rep", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="64 MiB, hidden 1K and 8K, bfloat16, layer")
    a = ap.parse_args(argv)
    if a.quick:
        a.mib, a.hiddens, a.dtypes, a.kinds = 64.0, "1024,8192", "bfloat16", "layer"
    return a


def main(argv=None):
    a = parse_args(argv)
    if not bench.has_gpu():
        print("norm_tune: no CUDA device; nothing to measure")
        return 2
    import cupy as cp

    defaults = {k: getattr(norm, k) for k in FWD_KNOBS + ("BWD_MAX_THREADS",)}
    rows_out = []
    try:
        for dname, hidden in itertools.product(a.dtypes.split(","), [int(h) for h in a.hiddens.split(",")]):
            dt = np.dtype(dname) if dname != "bfloat16" else norm._dtypes.bfloat16
            rows = max(1, int(a.mib * 2**20) // (hidden * dt.itemsize))
            x = (cp.random.standard_normal((rows, hidden), dtype=cp.float32) * 2 + 1).astype(dt)
            r = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
            dy = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
            w = cp.random.standard_normal(hidden, dtype=cp.float32) * 0.1 + 1
            b = cp.random.standard_normal(hidden, dtype=cp.float32) * 0.1
            dst = cp.empty_like(x)
            n = x.size * dt.itemsize
            copy = bench.time_cuda(lambda: dst.__setitem__(Ellipsis, x), rep=a.rep)["median_ms"]
            copy_gbps = 2 * n / copy / 1e6
            for kind in a.kinds.split(","):
                fn = norm.layer_norm if kind == "layer" else norm.rms_norm
                kw = {"bias": b} if kind == "layer" else {}
                nb_fwd = traffic.norm_bytes(rows, hidden, dt, kind)
                nb_res = traffic.norm_bytes(rows, hidden, dt, kind, residual=True)
                for setting in FWD_SETTINGS:
                    for k, v in zip(FWD_KNOBS, setting):
                        setattr(norm, k, v)
                    for op, nb, call in (("fwd", nb_fwd, lambda: fn(x, hidden, w, **kw)),
                                         ("fwd_res", nb_res, lambda: fn(x, hidden, w, residual=r, **kw))):
                        ms = bench.time_cuda(call, rep=a.rep)["median_ms"]
                        rows_out.append(dict(op=op, kind=kind, dtype=dname, hidden=hidden, rows=rows,
                                             setting=dict(zip(FWD_KNOBS, setting)), ms=ms, GBps=nb / ms / 1e6,
                                             frac_copy=nb / ms / 1e6 / copy_gbps, copy_GBps=copy_gbps))
                for k, v in defaults.items():
                    setattr(norm, k, v)
                _, *stats = fn(x, hidden, w, return_stats=True, **kw)
                mean, rstd = (stats if kind == "layer" else (None, stats[0]))
                nb_bwd = 3 * x.size * dt.itemsize
                for bt in BWD_SETTINGS:
                    norm.BWD_MAX_THREADS = bt
                    if kind == "layer":
                        call = lambda: norm.layer_norm_backward(dy, x, w, mean, rstd)  # noqa: E731
                    else:
                        call = lambda: norm.rms_norm_backward(dy, x, w, rstd)  # noqa: E731
                    ms = bench.time_cuda(call, rep=a.rep)["median_ms"]
                    rows_out.append(dict(op="bwd", kind=kind, dtype=dname, hidden=hidden, rows=rows,
                                         setting={"BWD_MAX_THREADS": bt}, ms=ms, GBps=nb_bwd / ms / 1e6,
                                         frac_copy=nb_bwd / ms / 1e6 / copy_gbps, copy_GBps=copy_gbps))
                norm.BWD_MAX_THREADS = defaults["BWD_MAX_THREADS"]
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        for k, v in defaults.items():
            setattr(norm, k, v)
    path = bench.write_results("norm_tune", rows_out, meta={"args": vars(a), "defaults": defaults})
    print(f"wrote {path}")
    # one line per (op, kind, dtype, hidden): every setting's fraction of copy, best marked
    groups = {}
    for r in rows_out:
        groups.setdefault((r["op"], r["kind"], r["dtype"], r["hidden"]), []).append(r)
    for key, rs in groups.items():
        best = max(rs, key=lambda r: r["GBps"])
        cells = " ".join(f"{'/'.join(str(int(v)) for v in r['setting'].values())}:{r['frac_copy']:.2f}"
                         + ("*" if r is best else "") for r in rs)
        print(f"{key[0]:7s} {key[1]:5s} {key[2]:8s} {key[3]:6d}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
