"""Probe (#3): the held split (softmax_hold, version 5: chunks held in shared memory, a cooperative persistent
grid) against the default plan on long rows, the copy in the same run; rounds interleaved per shape.

    PYTHONPATH=. python experiments/scratch/softmax_held_probe.py [--rounds 3] [--out experiments/results/x.json]
"""
import argparse
import json
import sys

import numpy as np

sys.path.insert(0, "experiments/scratch")
from _softmax_probe import sm, bench, copy_bandwidth, inputs, frac  # noqa: E402

SHAPES = [("float32", 1 << 17), ("float32", 1 << 18), ("float32", 1 << 19), ("float32", 1 << 20),
          ("bfloat16", 1 << 18), ("bfloat16", 1 << 19), ("bfloat16", 1 << 20),
          ("float16", 1 << 19), ("float16", 1 << 20)]
VARIANTS = {"default": None, "noheld": {"held": 0}}  # noheld: the planner without the held path
VARIANTS.update({"h%d%d%d" % c: {"path": "held", "config": c} for c in sm.HELD_CONFIGS})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--op", default="softmax", choices=("softmax", "log_softmax"))
    ap.add_argument("--stats", action="store_true", help="per-phase clock64 cycles of thread 0 (CUFLASH_HELD_STATS: "
                    "the counters are in the kernel on branch wip/softmax-held only)")
    ap.add_argument("--configs", default=None, help="held configs to time, e.g. 411,811 (default: all)")
    ap.add_argument("--shapes", default=None, help="e.g. float32:1048576,bfloat16:1048576 (default: all)")
    a = ap.parse_args()
    global SHAPES
    if a.configs:
        keep = {"h" + c for c in a.configs.split(",")} | {"default", "noheld"}
        for v in list(VARIANTS):
            if v not in keep:
                del VARIANTS[v]
    if a.shapes:
        SHAPES = [(d, int(c)) for d, c in (t.split(":") for t in a.shapes.split(","))]
    import cupy as cp
    import scipy.special

    op = sm.OP_SOFTMAX if a.op == "softmax" else sm.OP_LOG_SOFTMAX
    if a.stats:
        return stats(a, op)
    ref_fn = scipy.special.softmax if op == sm.OP_SOFTMAX else scipy.special.log_softmax
    rows_out = []
    for dname, cols, dt, rows, xs in inputs(SHAPES):
        x = xs[0]
        x64 = cp.asnumpy(x[:2].astype(cp.float32)).astype(np.float64)
        ref = ref_fn(x64, axis=-1)
        res = {k: [] for k in VARIANTS}
        plans, errs = {}, {}
        for v, part in VARIANTS.items():
            y, pl = sm._softmax_impl(x, -1, op, "online", part, return_plan=True)
            plans[v] = str(pl)
            errs[v] = float(np.max(np.abs(cp.asnumpy(y[:2].astype(cp.float32)).astype(np.float64) - ref)))
            del y
        copies = []
        for r in range(a.rounds):
            copies.append(copy_bandwidth())
            order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
            for v in order:
                part = VARIANTS[v]
                t = bench.time_cuda(lambda: sm._softmax_impl(x, -1, op, "online", part), warmup=3, rep=a.rep)
                res[v].append(t["median_ms"])
        copy = float(np.median(copies))
        row = {"dtype": dname, "cols": cols, "rows": rows, "copy_GBps": copy}
        for v in VARIANTS:
            ms = min(res[v])
            row[v] = {"plan": plans[v], "max_abs_err": errs[v], "ms_rounds": res[v],
                      "frac_best": frac(rows, cols, dt, ms, copy),
                      "frac_rounds": [frac(rows, cols, dt, m, copy) for m in res[v]]}
        rows_out.append(row)
        print(f"{dname:9s} {cols:8d} copy {copy:6.0f} | " + " | ".join(
            f"{v} {row[v]['frac_best']:.3f} e{row[v]['max_abs_err']:.0e}"
            for v in VARIANTS), flush=True)
        print("  rounds:", {v: [round(f, 3) for f in row[v]["frac_rounds"]] for v in VARIANTS}, flush=True)
    print("plans:", json.dumps({f"{r['dtype']} {r['cols']}": {v: r[v]["plan"] for v in VARIANTS} for r in rows_out},
                               indent=0))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"environment": bench.environment(), "op": a.op, "rows": rows_out}, f, indent=1)


def stats(a, op):
    """Each held config once per shape, built with -DCUFLASH_HELD_STATS: thread 0's cycles per phase and the spin
    retries, averaged per iteration (microseconds at the SM clock)."""
    import cupy as cp
    from cuflash import _compile

    opt = ("-DCUFLASH_HELD_STATS",)
    get = _compile.get_kernel
    sm._compile.get_kernel = lambda src, name, extra=(): get(src, name, tuple(extra) + (opt if "softmax_hold" in name
                                                                                         else ()))
    dev = cp.cuda.runtime.getDevice()
    mhz = cp.cuda.runtime.getDeviceProperties(dev)["clockRate"] / 1e3
    out = []
    for dname, cols, dt, rows, xs in inputs(SHAPES):
        x = xs[0]
        for v, part in VARIANTS.items():
            if part is None:
                continue
            y, pl = sm._softmax_impl(x, -1, op, "online", part, return_plan=True)
            key = ("softmax.cu", sm._held_name(sm._dtypes.CTYPE[dt], pl.copy), sm.CLUSTER_ARCH_OPTIONS + opt, dev)
            buf = cp.ndarray((8,), dtype=cp.uint64, memptr=_compile._MODULES[key].get_global("cuflash_held_stats"))
            res = []
            for _ in range(3):
                buf[...] = 0
                sm._softmax_impl(x, -1, op, "online", part)
                cp.cuda.runtime.deviceSynchronize()
                res.append(buf.get().astype(np.float64))
            r = np.median(np.array(res), axis=0)
            it = max(r[6], 1)
            us = {k: r[i] / it / mhz for i, k in enumerate(("copy_wait", "reduce", "state_wait", "output", "loop"))}
            row = {"dtype": dname, "cols": cols, "config": v, "us_per_iteration": us, "spins_per_iteration": r[5] / it,
                   "iterations": r[6], "clock_MHz": mhz}
            out.append(row)
            print(f"{dname:9s} {cols:8d} {v}: per iteration (us) " + " ".join(f"{k} {u:.2f}" for k, u in us.items())
                  + f" | spins/it {r[5] / it:.1f}, iterations {r[6]:.0f}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"environment": bench.environment(), "op": a.op, "stats": out}, f, indent=1)


if __name__ == "__main__":
    main()
