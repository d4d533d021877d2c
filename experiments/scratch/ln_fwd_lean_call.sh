#!/usr/bin/env bash
# Probe (scratch, #4, wip/ln-fwd-lean): same-run A/B of bfloat16 LayerNorm forward rows on norm_fwd (the register
# kernel: hidden 1K-16K; fused residual up to 8K) with to_floats against main's tree (abm/), three rounds.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/ln_fwd_lean_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
A="--kinds layer --ops fwd,fwd_res --dtypes bfloat16 --hiddens 1024,2048,4096,8192,16384 --no-torch --no-triton --rep 30"
for r in 1 2 3; do
  (cd abm && PYTHONPATH=. timeout 90 python experiments/norm_sweep.py $A --name ln_fwd_lean_tree_$r > /dev/null 2>&1)
  cp abm/experiments/results/ln_fwd_lean_tree_$r.* experiments/results/ 2>/dev/null
  timeout 90 python experiments/norm_sweep.py $A --name ln_fwd_lean_here_$r > /dev/null 2>&1
done
python - <<'PY'
import json
def load(n):
    d = json.load(open(f"experiments/results/{n}.json"))
    return {(r["op"], r["hidden"]): r for r in d["rows"] if r["impl"] == "cuflash"}
for r in (1, 2, 3):
    t, h = load(f"ln_fwd_lean_tree_{r}"), load(f"ln_fwd_lean_here_{r}")
    for k in sorted(h):
        print(r, k, "tree %.3f here %.3f x%.3f  err %.2g / %.2g" % (t[k]["frac_copy"], h[k]["frac_copy"],
              h[k]["frac_copy"] / t[k]["frac_copy"], t[k]["max_abs_err"], h[k]["max_abs_err"]))
PY
pack
