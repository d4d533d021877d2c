"""Print cuflash's rows of norm sweep results (op, kind, dtype, hidden, GB/s, of copy, x torch, x Triton, max abs
err): python experiments/scratch/norm_rows.py [FILE.json ...] (default experiments/results/norm_sweep.json; with
several files each row starts with the file's name)."""
import json
import sys
from pathlib import Path

files = sys.argv[1:] or ["experiments/results/norm_sweep.json"]
for f in files:
    for r in json.load(open(f))["rows"]:
        if r["impl"] == "cuflash":
            print(*([Path(f).stem] if len(files) > 1 else []), r["op"], r["kind"], r["dtype"], r["hidden"],
                  round(r["GBps"]), round(r["frac_copy"], 3), r.get("speed_vs_torch") and round(r["speed_vs_torch"], 2),
                  r.get("speed_vs_triton") and round(r["speed_vs_triton"], 2), r.get("max_abs_err"))
