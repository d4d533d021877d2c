"""Probe (scratch): ncu counters of cuflash's attention forward kernel against torch cuDNN's and FLASH's, bf16, the
bench shape (16K tokens, hidden 2048): duration, launch geometry, occupancy, pipe use, top stall reasons.
    python experiments/scratch/fwd_prof.py [seqlen 2048] [head_dim 64] [causal 1]
Output: $OUT/fwd_prof_<seqlen>_<head_dim>_<causal>.json (one row per kernel launch) and a summary on stdout.
FWD_PROF_BLOCKS=BR,BC adds cuflash's Hopper kernel with block_sizes (BR, BC).
(The backward counterpart, bwd_prof.py, found the preprocess and dQ convert at 0.8 / 1.5 TB/s: b0b8979.)"""
import json
import os
import sys

N, D, CAUSAL = (int(a) for a in (sys.argv[1:] + ["2048", "64", "1"][len(sys.argv) - 1:])[:3])
sys.path.insert(0, ".")
from cuflash import ncu  # noqa: E402

METRICS = ("gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "sm__maximum_warps_per_active_cycle_pct", "smsp__inst_executed.sum",
           "launch__registers_per_thread", "launch__block_size", "launch__grid_size",
           "launch__shared_mem_per_block_dynamic", "launch__shared_mem_per_block_static",
           "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
           r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
SETUP = f"""
import cupy as cp, cuflash, torch
from cuflash import _dtypes
from torch.nn.attention import sdpa_kernel, SDPBackend
N, D, causal = {N}, {D}, {bool(CAUSAL)}
B, H = 16384 // N, 2048 // D
q, k, v = (cp.random.standard_normal((B, H, N, D), dtype=cp.float32).astype(_dtypes.bfloat16) for _ in range(3))
tq, tk, tv = (torch.randn(B, H, N, D, device='cuda', dtype=torch.bfloat16) for _ in range(3))
def sdpa(backend):
    with sdpa_kernel(backend):
        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
"""
CALLS = {"cuflash": "cuflash.attention(q, k, v, causal=causal)",
         "torch_cudnn": "sdpa(SDPBackend.CUDNN_ATTENTION)", "torch_flash": "sdpa(SDPBackend.FLASH_ATTENTION)"}
if os.environ.get("FWD_PROF_BLOCKS"):  # e.g. "192,64": that Hopper tile too
    br, bc = (int(x) for x in os.environ["FWD_PROF_BLOCKS"].split(","))
    CALLS[f"cuflash_{br}x{bc}"] = f"cuflash.attention(q, k, v, causal=causal, schedule='wgmma', block_sizes=({br}, {bc}))"
res = ncu.measure_many(SETUP, list(CALLS.values()), metrics=METRICS, timeout=300)
rows = []
pre, suf = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
for name, r in zip(CALLS, res):
    if r["error"]:
        print(name, "ERROR", r["error"][:500])
        continue
    for ln in r["launches"]:
        m = ln.get("metrics", {})
        st = sorted(((k.removeprefix(pre).removesuffix(suf), v) for k, v in m.items() if "issue_stalled" in k),
                    key=lambda kv: -kv[1])[:6]
        rows.append({"impl": name, "kernel": ln.get("kernel", "")[:140],
                     **{k: v for k, v in m.items() if "stalled" not in k}, "stalls": st})
for r in rows:
    g = r.get
    print(f"{r['impl']:12s} {g('gpu__time_duration.sum', 0) / 1e3:8.1f} us  grid {g('launch__grid_size')} "
          f"block {g('launch__block_size')} regs {g('launch__registers_per_thread')} "
          f"smem {g('launch__shared_mem_per_block_dynamic')} "
          f"warps {g('sm__warps_active.avg.pct_of_peak_sustained_active', 0):.0f}% "
          f"issue {g('smsp__issue_active.avg.pct_of_peak_sustained_active', 0):.0f}% "
          f"tensor {g('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active', 0):.0f}% "
          f"| {r['kernel'][:70]} | {[(k[:16], round(v, 2)) for k, v in r['stalls'][:4]]}")
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"fwd_prof_{N}_{D}_{CAUSAL}.json"), "w"), indent=1)
