"""Print cuflash's rows of experiments/results/norm_sweep.json (op, kind, dtype, hidden, GB/s, of copy, x torch, x Triton)."""
import json
import sys

d = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "experiments/results/norm_sweep.json"))
for r in d["rows"]:
    if r["impl"] == "cuflash":
        print(r["op"], r["kind"], r["dtype"], r["hidden"], round(r["GBps"]), round(r["frac_copy"], 3),
              r.get("speed_vs_torch") and round(r["speed_vs_torch"], 2),
              r.get("speed_vs_triton") and round(r["speed_vs_triton"], 2))
