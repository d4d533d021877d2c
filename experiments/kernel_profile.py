"""Why a kernel is below its roofline: Nsight Compute counters for the rows the benchmarks show short of target.

For each call (one per kernel and shape, the weak rows of softmax_sweep / norm_sweep / attention_bench, plus a
strong row of the same kernel for contrast) one launch is profiled under ``ncu`` — all calls in ONE ncu process
(``cuflash.ncu.measure_many``), clocks left alone — and the per-launch counters are reduced to what decides a
memory- or latency-bound kernel: duration, DRAM and SM throughput (% of peak), achieved occupancy (% of the
SM's warp slots) against its limits (registers, shared memory, warps, blocks), issue-slot utilisation, and the
top warp-stall reasons (average warps stalled per issue, ``smsp__average_warps_issue_stalled_*``: long_scoreboard
= waiting on global memory, barrier, mio/lg_throttle = load/store queues full, math_pipe_throttle, wait, ...).

Writes experiments/results/kernel_profile.json|csv (one row per call and kernel launch). Without a GPU or without
ncu: one line, exit 2.

    python experiments/kernel_profile.py [--quick] [--only SUBSTRING] [--timeout S]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cuflash import bench, ncu  # noqa: E402

NAME = "kernel_profile"
METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio",
)
# What each column of the results is, from the metric above.
COLUMNS = {
    "duration_us": ("gpu__time_duration.sum", 1e-3),  # ns -> us
    "dram_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 1),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", 1),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", 1),
    "occupancy_theoretical_pct": ("sm__maximum_warps_per_active_cycle_pct", 1),
    "issue_active_pct": ("smsp__issue_active.avg.pct_of_peak_sustained_active", 1),
    "registers": ("launch__registers_per_thread", 1),
    "blocks_limit_regs": ("launch__occupancy_limit_registers", 1),
    "blocks_limit_smem": ("launch__occupancy_limit_shared_mem", 1),
    "blocks_limit_warps": ("launch__occupancy_limit_warps", 1),
}
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"

SETUP = """
import numpy as np, cupy as cp, cuflash
from cuflash import _dtypes
bf16 = _dtypes.bfloat16
def rnd(shape, dt):
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(dt)
"""


def calls(quick: bool) -> list[tuple[str, str, str]]:
    """(label, setup lines, call) per profiled row: ~256 MiB inputs as in the sweeps (64 MiB with --quick)."""
    m = 4 if quick else 1  # rows divided by m
    out = []
    for label, rows, cols, dt in (("softmax warp (strong)", 131072, 1024, "bf16"),
                                  ("softmax block 32K (weak)", 4096, 32768, "bf16"),
                                  ("softmax cluster 64K (weak)", 2048, 65536, "bf16"),
                                  ("softmax split 1M (weak)", 128, 1048576, "bf16")):
        out.append((f"{label} {rows // m}x{cols} {dt}", f"x = rnd(({rows // m}, {cols}), {dt})",
                    "cuflash.softmax(x, axis=-1)"))
    for label, rows, hidden, dt, call in (
            ("rms_norm fwd (strong)", 131072, 1024, "bf16", "cuflash.rms_norm(x, (h,), w)"),
            ("layer_norm fwd (weak)", 131072, 1024, "bf16", "cuflash.layer_norm(x, (h,), w, b)"),
            ("layer_norm fwd 32K (weak)", 2048, 32768, "cp.float32", "cuflash.layer_norm(x, (h,), w, b)"),
            ("layer_norm bwd 32K (weak)", 4096, 32768, "bf16",
             "cuflash.layer_norm_backward(dy, x, w, mean, rstd)")):
        rows //= m
        setup = (f"h = {hidden}\nx = rnd(({rows}, h), {dt})\nw = rnd((h,), {dt})\nb = rnd((h,), {dt})\n"
                 f"dy = rnd(({rows}, h), {dt})\n"
                 "_, mean, rstd = cuflash.layer_norm(x, (h,), w, b, return_stats=True)")
        out.append((f"{label} {rows}x{hidden} {dt.replace('cp.float32', 'f32')}", setup, call))
    for label, n, d, causal in (("attention wgmma d64 16K", 16384, 64, False),
                                ("attention wgmma d128 16K", 16384, 128, False),
                                ("attention wgmma d64 1K causal", 1024, 64, True)):
        bsz, heads = max(16384 // n // m, 1), 2048 // d
        setup = f"q, k, v = (rnd(({bsz}, {heads}, {n}, {d}), bf16) for _ in range(3))"
        out.append((f"{label} B{bsz} H{heads}", setup, f"cuflash.attention(q, k, v, causal={causal})"))
    return out


def summarise(label: str, launch: dict) -> dict:
    """One results row from a launch's metrics: the COLUMNS and the top three stall reasons."""
    m = launch.get("metrics", {})
    row = {"call": label, "kernel": launch.get("kernel", "")[:160]}
    for col, (metric, scale) in COLUMNS.items():
        if metric in m:
            row[col] = m[metric] * scale
    stalls = sorted(((k[len(STALL_PREFIX):-len(STALL_SUFFIX)], v) for k, v in m.items()
                     if k.startswith(STALL_PREFIX) and k.endswith(STALL_SUFFIX)), key=lambda kv: -kv[1])
    for i, (reason, v) in enumerate(stalls[:3]):
        row[f"stall_{i + 1}"] = f"{reason} {v:.2f}"
    row["dram_bytes"] = launch.get("read_bytes", 0.0) + launch.get("write_bytes", 0.0)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the rows (64 MiB inputs)")
    ap.add_argument("--only", default=None, help="profile only the calls whose label contains this")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds for the one ncu process")
    a = ap.parse_args(argv)
    if not bench.has_gpu() or not ncu.available():
        print("kernel_profile: needs a CUDA GPU and Nsight Compute (ncu) on the PATH; nothing measured")
        return 2
    todo = [c for c in calls(a.quick) if a.only is None or a.only in c[0]]
    # every call's inputs are made in the setup (outside the profiled range), each in its own namespace E[i]
    setup = SETUP + "E = []\n" + "".join(f"E.append({{}})\nexec({s!r}, globals(), E[-1])\n" for _, s, _ in todo)
    res = ncu.measure_many(setup, [f"eval({c!r}, globals(), E[{i}])" for i, (_, _, c) in enumerate(todo)],
                           metrics=METRICS, timeout=a.timeout)  # every kernel of a call (no name filter)
    rows = []
    for (label, _, _), r in zip(todo, res):
        if r["error"]:
            rows.append({"call": label, "error": r["error"][:300]})
            continue
        rows += [summarise(label, ln) for ln in r["launches"]]
    for row in rows:
        print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    path = bench.write_results(NAME, rows, {"metrics": list(METRICS), "ncu": "one process, --clock-control none",
                                            "quick": a.quick})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
