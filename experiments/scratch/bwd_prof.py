"""Probe (scratch): ncu counters of cuflash's attention backward kernels vs torch FLASH's, bf16, the bench shape
(16K tokens, hidden 2048).   python experiments/scratch/bwd_prof.py [seqlen 4096] [head_dim 128] [causal 0]
Output: $OUT/bwd_prof_<seqlen>_<head_dim>_<causal>.json"""
import sys, json, os
N, D, CAUSAL = (int(a) for a in (sys.argv[1:] + ["4096", "128", "0"][len(sys.argv) - 1:])[:3])
sys.path.insert(0, ".")
from cuflash import ncu
METRICS = ("gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
           "l1tex__throughput.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
           "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
           "smsp__inst_executed_op_ldsm.sum", "smsp__inst_executed_op_shared_ld.sum",
           "smsp__inst_executed_op_shared_st.sum",
           "launch__registers_per_thread", "launch__block_size", "launch__grid_size",
           "launch__shared_mem_per_block_dynamic", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
SETUP = f"""
import cupy as cp, cuflash, torch
from cuflash import _dtypes
N, D, causal = {N}, {D}, {bool(CAUSAL)}
B, H = 16384 // N, 2048 // D
def rnd(s):
    return cp.random.standard_normal(s, dtype=cp.float32).astype(_dtypes.bfloat16)
q, k, v, do = (rnd((B, H, N, D)) for _ in range(4))
out, lse = cuflash.attention(q, k, v, causal=causal, return_lse=True)
tq, tk, tv = (torch.randn(B, H, N, D, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
from torch.nn.attention import sdpa_kernel, SDPBackend
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
tdo = torch.randn_like(to)
def tb():
    torch.autograd.grad(to, (tq, tk, tv), tdo, retain_graph=True)
"""
res = ncu.measure_many(SETUP, ["cuflash.attention_backward(do, q, k, v, out, lse, causal=causal)", "tb()"], metrics=METRICS,
                       timeout=300)
rows = []
for name, r in zip(("cuflash", "torch_flash"), res):
    if r["error"]:
        print(name, "ERROR", r["error"][:500]); continue
    for ln in r["launches"]:
        m = ln.get("metrics", {})
        pre, suf = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
        st = sorted(((k.removeprefix(pre).removesuffix(suf), v) for k, v in m.items() if "issue_stalled" in k),
                    key=lambda kv: -kv[1])[:6]
        row = {"impl": name, "kernel": ln.get("kernel", "")[:110],
               **{k: v for k, v in m.items() if "stalled" not in k}, "stalls": st}
        rows.append(row)
        print(json.dumps(row))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"bwd_prof_{N}_{D}_{CAUSAL}.json"), "w"), indent=1)
