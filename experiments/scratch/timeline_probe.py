"""Probe (#3, scratch): where a launch's time over copy goes, block by block. The softmax kernels built with
-DCUFLASH_TIMELINE (cuda_src/cuflash/common.cuh: each block records %globaltimer at its start, when its row's state
is known and at its end, and its SM), and a copy shaped like the register path (each thread loads NV 16-byte slots,
optionally a block barrier, then stores them) with the same marks. For each shape: the launch's event time with and
without the marks, the span the blocks cover, a block's life, and the estimated HBM rate over time (each block's
read bytes spread over [start, state], its write bytes over [state, end]) against its steady middle: the time lost
at the head and at the tail of the launch.
    PYTHONPATH=. python experiments/scratch/timeline_probe.py            (device)
Writes experiments/results/timeline_probe_<commit>.json."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _softmax_probe import NBYTES, bench, copy_bandwidth, inputs, sm  # noqa: E402
from cuflash import _compile  # noqa: E402
import cupy as cp  # noqa: E402

NTL = 65536
TL_OPT = (f"-DCUFLASH_TIMELINE={NTL}",)
if "--build" in sys.argv:  # here: the instrumented softmax kernels' cubins for the carried cache (KC_DIR)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import kcache_offline as ko
    jobs = [(src, n, list(opts) + list(TL_OPT)) for src, n, opts, _ in _compile.declared()
            if src == "softmax.cu" and ("softmax_cached<" in n or "softmax_cluster<" in n)
            and ("__nv_bfloat16," in n or "float," in n)]
    sys.exit(1 if ko.build_many(jobs, os.environ["KC_DIR"]) else 0)
SHAPES = [("bfloat16", 4096), ("bfloat16", 16384), ("bfloat16", 32768), ("float32", 16384), ("float32", 32768),
          ("bfloat16", 65536), ("float32", 131072)]
ON = []
_get = _compile.get_kernel


USED = set()  # the instrumented kernels' (name, options)


def get_kernel(source, name, extra_options=()):
    opts = tuple(extra_options) + (TL_OPT if ON and source == "softmax.cu" else ())
    k = _get(source, name, opts)
    if ON and source == "softmax.cu":
        USED.add((name, opts, k))
    return k


sm._compile.get_kernel = get_kernel

COPY_SRC = r"""
#include <cuflash/common.cuh>
template <int THREADS, int NV>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS) tl_copy(const uint4* x, uint4* y, int sync) {
  CUFLASH_TL(0);
  uint4 b[NV];
  const long long base = (long long)blockIdx.x * THREADS * NV + threadIdx.x;
#pragma unroll
  for (int i = 0; i < NV; ++i) b[i] = x[base + i * THREADS];
  if (sync) __syncthreads();
  CUFLASH_TL(1);
#pragma unroll
  for (int i = 0; i < NV; ++i) __stcs(&y[base + i * THREADS], b[i]);
  CUFLASH_TL(2);
}
// A persistent copy that keeps two register buffers of NV slots a thread: the next chunk's loads are in flight
// while this chunk is stored (reads and writes mixed, as a streaming kernel); grid = the resident blocks.
template <int THREADS, int NV>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS) tl_pipe(const uint4* __restrict__ x,
                                                                   uint4* __restrict__ y, long long nchunks) {
  CUFLASH_TL(0);
  constexpr long long CH = (long long)THREADS * NV;
  uint4 a[NV], b[NV];
  long long c = blockIdx.x;
  const long long g = gridDim.x;
  if (c < nchunks)
#pragma unroll
    for (int i = 0; i < NV; ++i) a[i] = x[c * CH + threadIdx.x + i * THREADS];
  bool first = true;
  for (; c < nchunks; c += 2 * g) {
    const long long c2 = c + g, c3 = c + 2 * g;
    if (c2 < nchunks)
#pragma unroll
      for (int i = 0; i < NV; ++i) b[i] = x[c2 * CH + threadIdx.x + i * THREADS];
#pragma unroll
    for (int i = 0; i < NV; ++i) __stcs(&y[c * CH + threadIdx.x + i * THREADS], a[i]);
    if (first) CUFLASH_TL(1);
    first = false;
    if (c2 >= nchunks) break;
    if (c3 < nchunks)
#pragma unroll
      for (int i = 0; i < NV; ++i) a[i] = x[c3 * CH + threadIdx.x + i * THREADS];
#pragma unroll
    for (int i = 0; i < NV; ++i) __stcs(&y[c2 * CH + threadIdx.x + i * THREADS], b[i]);
  }
  CUFLASH_TL(2);
}
"""
COPIES = [(64, 8), (256, 8), (512, 8)]
PIPES = [(256, 4), (512, 4), (512, 2), (1024, 2)]


def timeline_buffer(mod):
    return cp.ndarray((NTL, 4), dtype=cp.uint64, memptr=mod.get_global("cuflash_timeline"))


def analyse(tl, nblocks, bytes_per_block, event_ms):
    """Summary of one launch's timeline (ns marks) of nblocks blocks each reading and writing bytes_per_block."""
    t = tl[:nblocks].astype(np.int64)
    s, m, e, smid = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
    t0 = s.min()
    s, m, e = s - t0, m - t0, e - t0
    span = e.max()
    edges = np.arange(0, span + 1000, 1000)  # 1 us bins
    lo, hi = edges[:-1][None, :], edges[1:][None, :]

    def spread(a, b, nbytes):
        d = np.maximum(b - a, 1)[:, None]
        ov = np.clip(np.minimum(b[:, None], hi) - np.maximum(a[:, None], lo), 0, None)
        return (ov / d * nbytes).sum(0)

    rate = np.zeros(len(edges) - 1)
    for k in range(0, nblocks, 4096):  # in pieces: blocks x bins
        sl = slice(k, k + 4096)
        rate += spread(s[sl], m[sl], bytes_per_block) + spread(m[sl], e[sl], bytes_per_block)
    rate = rate / 1e3  # GB/s (bytes per ns)
    nb = len(rate)
    mid = rate[nb // 4: 3 * nb // 4]
    steady = float(np.median(mid))
    ideal_us = 2 * nblocks * bytes_per_block / steady / 1e3
    lost = np.clip(1 - rate / steady, 0, None)
    head, tail = float(lost[: nb // 4].sum()), float(lost[3 * nb // 4:].sum())
    per_sm = np.bincount(smid.astype(np.int64), minlength=132)
    life = e - s
    prof = lambda r: " ".join("%d" % min(9, round(10 * x / steady)) for x in r)  # noqa: E731
    return dict(event_us=event_ms * 1e3, span_us=span / 1e3, steady_gbs=steady, ideal_us=ideal_us,
                lost_head_us=head, lost_tail_us=tail, life_med_us=float(np.median(life)) / 1e3,
                read_med_us=float(np.median(m - s)) / 1e3, first_end_us=float(e.min()) / 1e3,
                last_start_us=float(s.max()) / 1e3, blocks_per_sm=(int(per_sm.min()), int(per_sm.max())),
                tick_ns=int(np.min(np.diff(np.unique(s))[:100])) if len(np.unique(s)) > 1 else 0,
                head_prof=prof(rate[:14]), tail_prof=prof(rate[-18:]))


def show(tag, a):
    print(f"{tag:28s} ev {a['event_us']:6.1f} span {a['span_us']:6.1f} ideal {a['ideal_us']:6.1f} | steady "
          f"{a['steady_gbs']:5.0f} | lost head {a['lost_head_us']:4.1f} tail {a['lost_tail_us']:4.1f} | life "
          f"{a['life_med_us']:5.2f} read {a['read_med_us']:5.2f} | 1st end {a['first_end_us']:5.2f} last start "
          f"{a['last_start_us']:6.1f} | b/SM {a['blocks_per_sm']} tick {a['tick_ns']}", flush=True)
    print(f"{'':28s} head {a['head_prof']} | tail {a['tail_prof']}", flush=True)


def time_ms(fn):
    return bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]


out = []
copy = copy_bandwidth()
print(f"cudaMemcpy-like copy (cupy): {copy:.0f} GB/s, {2 * NBYTES / copy / 1e3:.1f} us at 256 MiB", flush=True)

mod = cp.RawModule(code=COPY_SRC, options=_compile.options(TL_OPT), name_expressions=[
    f"tl_copy<{t}, {v}>" for t, v in COPIES] + [f"tl_pipe<{t}, {v}>" for t, v in PIPES])
tlc = timeline_buffer(mod)
src = cp.empty(NBYTES // 4, dtype=cp.uint32)
src[...] = 7
dst = cp.empty_like(src)
dst[...] = 1
for rnd in range(0 if os.environ.get("SKIP_COPY") else 2):
    for t, v in COPIES:
        k = mod.get_function(f"tl_copy<{t}, {v}>")
        nblk = NBYTES // (t * v * 16)
        for sync in (0, 1):
            fn = lambda: k((nblk,), (t,), (src, dst, np.int32(sync)))  # noqa: E731
            ms = time_ms(fn)
            for rep in range(3):
                tlc[...] = 0
                fn()
                cp.cuda.Device().synchronize()
                a = analyse(tlc.get(), nblk, t * v * 16, ms)
                a.update(round=rnd, rep=rep, what=f"copy{t}x{v}" + ("+sync" if sync else ""))
                out.append(a)
                if rep == 0:
                    show(f"r{rnd} copy {t}x{v}{' sync' if sync else ''}", a)
    for t, v in PIPES:
        k = mod.get_function(f"tl_pipe<{t}, {v}>")
        nch = NBYTES // (t * v * 16)
        for per_sm in (1024 // t, 512 // t):
            if per_sm * t > 1024 or per_sm < 1:
                continue
            grid = 132 * per_sm
            fn = lambda: k((grid,), (t,), (src, dst, np.int64(nch)))  # noqa: E731
            ms = time_ms(fn)
            tlc[...] = 0
            fn()
            cp.cuda.Device().synchronize()
            tl = tlc.get()
            e = tl[:grid, 2].astype(np.int64) - tl[:grid, 0].astype(np.int64).min()
            s0 = tl[:grid, 0].astype(np.int64) - tl[:grid, 0].astype(np.int64).min()
            a = dict(round=rnd, what=f"pipe{t}x{v} grid {grid}", event_us=ms * 1e3, span_us=e.max() / 1e3,
                     last_start_us=s0.max() / 1e3, first_end_us=e.min() / 1e3)
            out.append(a)
            print(f"r{rnd} pipe {t}x{v} grid {grid:5d}          ev {ms * 1e3:6.1f} span {e.max() / 1e3:6.1f} | "
                  f"last start {s0.max() / 1e3:5.2f} | block ends {e.min() / 1e3:6.1f}..{e.max() / 1e3:6.1f}",
                  flush=True)
del src, dst

for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    _, pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
    fn = lambda: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None)  # noqa: E731
    USED.clear()
    for rnd in range(2):
        ON[:] = []
        sm._PREP.clear()  # the prepared launch holds its kernel
        ms_plain = time_ms(fn)
        ON[:] = [1]
        sm._PREP.clear()
        ms = time_ms(fn)
        mods = {k[:2]: m_ for k, m_ in _compile._MODULES.items() if k[0] == "softmax.cu" and k[1:3] in
                {u[:2] for u in USED}}
        if not mods:  # the module of a kernel that get_kernel returned
            print("no module found:", [u[:2] for u in USED], list(_compile._MODULES)[:4], flush=True)
        C = pl.chunks if pl.path == "cluster" else 1
        for rep in range(3):
            for m_ in mods.values():
                timeline_buffer(m_)[...] = 0
            fn()
            cp.cuda.Device().synchronize()
            tl = sum(timeline_buffer(m_).get() for m_ in mods.values())
            nblk = int((tl[:, 0] != 0).sum())  # the blocks that ran (all of them: fewer than NTL here)
            a = analyse(tl, nblk, rows * cols * dt.itemsize // nblk, ms)
            a.update(round=rnd, rep=rep, what=f"softmax {dname} {cols}", path=pl.path, C=C, ms_plain=ms_plain,
                     nblocks=nblk)
            out.append(a)
            if rep == 0:
                show(f"r{rnd} {dname} {cols} {pl.path} C{C} ({ms_plain * 1e3:.1f})", a)
    del x
    ON[:] = []
    sm._PREP.clear()

bench.write_results(f"timeline_probe_{bench.git_commit()[:7]}", out, {})
