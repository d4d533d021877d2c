"""Probe (#3, scratch): the two speeds of one cluster row. float32 32K (C = 2) and 128K (C = 8) ran 0.144 ms in
some processes and 0.150 ms in others (same kernel, same shapes; sm_variants / sm_place against softmax_slope). This
times them under several conditions in one process, with a timestamp per line, while nvidia-smi samples the clocks
and power (sm_mode_smi.csv): fresh inputs per timing, the same input kept, inputs inside one big buffer, after a
bfloat16 row. Writes experiments/results/sm_mode_probe_<commit>.json.
    PYTHONPATH=. python experiments/scratch/sm_mode_probe.py"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from _softmax_probe import NBYTES, bench, copy_bandwidth, sm, sw  # noqa: E402

t0 = time.time()
out = []


def timeit(tag, x, y=None):
    if y is None:
        fn = lambda: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None)  # noqa: E731
    else:
        pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
        fn = lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y)  # noqa: E731
    r = bench.time_cuda(fn, warmup=3, rep=30)
    out.append(dict(t=time.time() - t0, tag=tag, dtype=str(x.dtype), cols=x.shape[1], **r))
    print("%6.2f s %-28s %-8s %6d  median %.4f  min %.4f  p80 %.4f" % (time.time() - t0, tag, x.dtype, x.shape[1],
          r["median_ms"], r["min_ms"], r["p80_ms"]), flush=True)


copy = copy_bandwidth()
print("copy GB/s %.0f" % copy)
for cols in (32768, 131072):
    rows = NBYTES // (cols * 4)
    for k in range(3):
        x, _ = sw._inputs(rows, cols, "float32", None)
        timeit(f"fresh input {k}", x)
        timeit(f"same input again {k}", x)
        del x
    x, _ = sw._inputs(rows, cols, "float32", None)
    for k in range(5):
        timeit(f"kept input {k}", x)
    xb, _ = sw._inputs(NBYTES // (65536 * 2), 65536, "bfloat16", None)
    timeit("bf16 64K between", xb)
    del xb
    timeit("kept input after bf16", x)
    buf = cp.empty(3 * NBYTES, dtype=cp.uint8)
    xs = buf[:NBYTES].view(cp.float32).reshape(rows, cols)
    xs[...] = x
    timeit("in big buffer, pool y", xs)
    timeit("in big buffer, buffer y", xs, buf[NBYTES:2 * NBYTES].view(cp.float32).reshape(rows, cols))
    del buf, xs, x
bench.write_results(f"sm_mode_probe_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
