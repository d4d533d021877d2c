"""Probe (#4, scratch; its kernel marks are on branch wip/norm-timeline only, main has none): in norm_fwd_stream, what a block's time goes to, row by row. Built
with -DCUFLASH_TIMELINE, each block sums over its rows the time it waits for a row's staged copies (every thread's:
a block barrier after the wait) and the time it works on the row (statistics and output), by %globaltimer. If the
waits are ~0 the kernel is bound by its work per row; if the work is small and the waits large, by the loads.
    PYTHONPATH=. python experiments/scratch/norm_timeline_probe.py      (device)
Writes experiments/results/norm_timeline_probe_<commit>.json."""
import os
import sys

import numpy as np
import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuflash  # noqa: E402
from cuflash import _compile, _dtypes, bench, norm as nm  # noqa: E402

NTL = 4096
TL_OPT = (f"-DCUFLASH_TIMELINE={NTL}",)
NBYTES = 256 << 20
SHAPES = [("layer", "float32", 16384, False), ("layer", "bfloat16", 32768, False)]  # (plain LayerNorm's stream rows)
ON, USED = [], set()
_get = _compile.get_kernel


def get_kernel(source, name, extra_options=()):
    opts = tuple(extra_options) + (TL_OPT if ON and source == "norm.cu" else ())
    k = _get(source, name, opts)
    if ON and source == "norm.cu":
        USED.add((name, opts))
    return k


_compile.get_kernel = get_kernel
if "--build" in sys.argv:  # here: the marked norm_fwd_stream kernels' cubins for the carried cache (KC_DIR)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import kcache_offline as ko
    jobs = [(s_, n, list(o) + list(TL_OPT)) for s_, n, o, _ in _compile.declared()
            if s_ == "norm.cu" and "norm_fwd_stream<" in n and ("__nv_bfloat16, __nv_bfloat16" in n or "float, float" in n)]
    sys.exit(1 if ko.build_many(jobs, os.environ["KC_DIR"]) else 0)


def time_ms(fn):
    return bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]


src = cp.empty(NBYTES, dtype=cp.uint8)
dst = cp.empty_like(src)
copy_ms = time_ms(lambda: cp.copyto(dst, src))
del src, dst
copy = 2 * NBYTES / (copy_ms * 1e-3) / 1e9
print(f"copy {copy:.0f} GB/s", flush=True)
out = []
for kind, dname, hidden, res in SHAPES:
    dt = getattr(_dtypes, dname)
    rows = NBYTES // (hidden * dt.itemsize)
    x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
    r = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt) if res else None
    w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt)
    f = cuflash.layer_norm if kind == "layer" else cuflash.rms_norm
    args = (w, b) if kind == "layer" else (w,)
    fn = lambda: f(x, (hidden,), *args, residual=r)  # noqa: E731
    nbytes = rows * hidden * dt.itemsize * (4 if res else 2)
    for rnd, ticket in [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True)]:
        nm.STREAM_TICKET = ticket
        ON[:] = []
        nm._FWD_CFG.clear()
        ms_plain = time_ms(fn)
        ON[:] = [1]
        nm._FWD_CFG.clear()
        USED.clear()
        ms = time_ms(fn)
        mods = [m for k, m in _compile._MODULES.items() if k[0] == "norm.cu" and k[1:3] in USED]
        assert len(mods) == 1, (USED, len(mods))
        buf = cp.ndarray((NTL, 4), dtype=cp.uint64, memptr=mods[0].get_global("cuflash_timeline"))
        buf[...] = 0
        fn()
        cp.cuda.Device().synchronize()
        tl = buf.get().astype(np.int64)
        emit, entry = tl[NTL // 2:, 0], tl[NTL // 2:, 1]
        nb = int((tl[:NTL // 2, 0] != 0).sum())
        if nb == 0:
            print(kind, dname, hidden, "not on norm_fwd_stream", flush=True)
            break
        tl, emit, entry = tl[:nb], emit[:nb], entry[:nb]
        t00 = entry.min()
        print(f"   entry +0..{(entry.max() - t00) / 1e3:.2f} us, loop start +{(tl[:, 0].min() - t00) / 1e3:.2f}.."
              f"{(tl[:, 0].max() - t00) / 1e3:.2f}, ends +{(tl[:, 2].min() - t00) / 1e3:.1f}..{(tl[:, 2].max() - t00) / 1e3:.1f}"
              f" us after the first entry; event {ms * 1e3:.1f} us", flush=True)
        tot = (tl[:, 2] - tl[:, 0]).astype(float)
        rpb = rows / nb
        med = lambda v: float(np.median(v)) / 1e3 / rpb  # noqa: E731  (us per row)
        hbm_row_us = nbytes / rows * nb / (copy * 1e3)  # a row of every block at copy speed (us)
        a = dict(round=rnd, ticket=ticket, block_us_p50=float(np.median(tot)) / 1e3, block_us_max=tot.max() / 1e3,
                 block_us_min=tot.min() / 1e3, kind=kind, dtype=dname, hidden=hidden, residual=res, ms_plain=ms_plain, ms=ms,
                 frac_plain=nbytes / (ms_plain * 1e-3) / 1e9 / copy, blocks=nb, rows_per_block=rpb,
                 span_us=(tl[:, 2].max() - tl[:, 0].min()) / 1e3, row_us=med(tot * 1e0), wait_row_us=med(tl[:, 1]),
                 stats_row_us=med(tl[:, 3]), emit_row_us=med(emit), hbm_row_us=hbm_row_us)
        a["rest_row_us"] = a["row_us"] - a["wait_row_us"] - a["stats_row_us"] - a["emit_row_us"]
        out.append(a)
        print(f"r{rnd} {'ticket' if ticket else 'fixed '} blocks {a['block_us_min']:.0f}/{a['block_us_p50']:.0f}/"
              f"{a['block_us_max']:.0f} us (min/med/max) {kind:5s} {dname:8s} {hidden:6d} res={int(res)} | {ms_plain * 1e3:6.1f} us "
              f"({a['frac_plain']:.3f} of copy), marked {ms * 1e3:6.1f} | {nb} blocks x {rpb:.1f} rows | per row "
              f"{a['row_us']:.2f} us: wait {a['wait_row_us']:.2f}, stats {a['stats_row_us']:.2f}, output "
              f"{a['emit_row_us']:.2f}, issue/rest {a['rest_row_us']:.2f} | at copy speed {hbm_row_us:.2f}", flush=True)
    del x, r
ON[:] = []
bench.write_results(f"norm_timeline_probe_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
