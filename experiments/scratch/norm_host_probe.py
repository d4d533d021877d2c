"""Probe (#4, scratch): host work per call of the norm wrappers (small input, so the host is the limit):
bench.host_us_per_call of layer_norm / rms_norm forward and backward, and softmax for scale, then a cProfile of
2000 calls of each (top 12 by own time); time_cuda of each call beside (its GPU time).
    PYTHONPATH=. python experiments/scratch/norm_host_probe.py       (device)"""
import cProfile
import io
import pstats

import cupy as cp

import cuflash
from cuflash import bench

x = cp.random.standard_normal((8, 1024), dtype=cp.float32)
w, b = cp.ones(1024, cp.float32), cp.zeros(1024, cp.float32)
dy = cp.random.standard_normal((8, 1024), dtype=cp.float32)
_, mean, rstd = cuflash.layer_norm(x, 1024, w, b, return_stats=True)
_, rrstd = cuflash.rms_norm(x, 1024, w, return_stats=True)
CALLS = {
    "softmax": lambda: cuflash.softmax(x, axis=-1),
    "layer_norm": lambda: cuflash.layer_norm(x, 1024, w, b),
    "rms_norm": lambda: cuflash.rms_norm(x, 1024, w),
    "rms_norm eps=1e-6": lambda: cuflash.rms_norm(x, 1024, w, 1e-6),
    "layer_norm return_stats": lambda: cuflash.layer_norm(x, 1024, w, b, return_stats=True),
    "layer_norm_backward": lambda: cuflash.layer_norm_backward(dy, x, w, mean, rstd),
    "rms_norm_backward": lambda: cuflash.rms_norm_backward(dy, x, w, rrstd),
}
for name, f in CALLS.items():
    print(f"{name:<26} {bench.host_us_per_call(f):7.1f} us a call (GPU time {1e3 * bench.time_cuda(f)['median_ms']:.1f} us)",
          flush=True)
for name in ("layer_norm", "rms_norm", "layer_norm_backward"):
    f = CALLS[name]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        f()
    pr.disable()
    cp.cuda.Device().synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    print(f"--- {name}: cProfile, 2000 calls\n" + "\n".join(s.getvalue().splitlines()[6:24]), flush=True)
