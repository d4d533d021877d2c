"""Probe (#4, scratch): norm_fwd_stream with its row ticket against the fixed share (norm.STREAM_TICKET), plain
LayerNorm on the rows it takes (float32 16K, bfloat16 32K), interleaved, three rounds, copy in the same run.
    PYTHONPATH=. python experiments/scratch/norm_ticket_ab.py       (device)"""
import numpy as np
import cupy as cp

from cuflash import _dtypes, bench, norm as nm

NBYTES = 256 << 20
src = cp.empty(NBYTES, dtype=cp.uint8)
dst = cp.empty_like(src)
copy = 2 * NBYTES / (bench.time_cuda(lambda: cp.copyto(dst, src), warmup=3, rep=30)["median_ms"] * 1e-3) / 1e9
del src, dst
out = []
for dname, hidden in [("float32", 16384), ("bfloat16", 32768)]:
    dt = getattr(_dtypes, dname)
    rows = NBYTES // (hidden * dt.itemsize)
    x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
    w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    res = {}
    for rnd in range(3):
        for ticket in (False, True):
            nm.STREAM_TICKET = ticket
            ms = bench.time_cuda(lambda: nm.layer_norm(x, (hidden,), w, b), warmup=3, rep=30)["median_ms"]
            f = 2 * NBYTES / (ms * 1e-3) / 1e9 / copy
            out.append(dict(round=rnd, ticket=ticket, dtype=dname, hidden=hidden, ms=ms, frac_of_copy=f))
            res.setdefault(ticket, []).append(f)
    print(dname, hidden, "fixed", " ".join("%.3f" % v for v in res[False]), "| ticket",
          " ".join("%.3f" % v for v in res[True]), flush=True)
    del x
nm.STREAM_TICKET = True
bench.write_results(f"norm_ticket_ab_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
