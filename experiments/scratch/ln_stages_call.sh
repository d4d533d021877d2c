#!/usr/bin/env bash
# One device call for wip/ln-stream-stages (#4): same-run A/B of the LayerNorm forward rows on norm_fwd_stream
# (float32 16K, bfloat16 32K; three rows staged against two) and their neighbours against main's tree (abm/),
# interleaved three times.   CUFLASH_COMMIT=<hash> bash experiments/scratch/ln_stages_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
A="--kinds layer,rms --ops fwd --dtypes float32,bfloat16 --hiddens 8192,16384,32768 --no-torch --no-triton --rep 30"
for r in 1 2 3; do
  (cd abm && PYTHONPATH=. timeout 60 python experiments/norm_sweep.py $A --name ln_stages_tree_$r > /dev/null 2>&1)
  cp abm/experiments/results/ln_stages_tree_$r.* experiments/results/ 2>/dev/null
  timeout 60 python experiments/norm_sweep.py $A --name ln_stages_here_$r > /dev/null 2>&1
done
python - <<'PY'
import json
def load(n):
    d = json.load(open(f"experiments/results/{n}.json"))
    return {(r["kind"], r["dtype"], r["hidden"]): r for r in d["rows"] if r["impl"] == "cuflash"}
for r in (1, 2, 3):
    t, h = load(f"ln_stages_tree_{r}"), load(f"ln_stages_here_{r}")
    for k in sorted(h):
        print(r, k, "tree %.3f here %.3f x%.3f  err %.2g / %.2g" % (t[k]["frac_copy"], h[k]["frac_copy"],
              h[k]["frac_copy"] / t[k]["frac_copy"], t[k]["max_abs_err"], h[k]["max_abs_err"]))
PY
pack
