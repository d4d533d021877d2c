#!/usr/bin/env bash
# One device call for wip/ln-stream-lean (#4): the norm and validation tests, then a same-run A/B of the LayerNorm
# forward rows on norm_fwd_stream (float32 16K, bfloat16 32K with weight and bias; and the rows around them)
# against main's tree (abm/), interleaved twice, then ncu's instruction count of the new kernel at bf16 32K.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/ln_lean_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_norm_tests.json timeout 200 python -m pytest -q \
  -n 15 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_norm.py tests/test_validation.py 2>&1 | tail -3
pack; el tests
A="--kinds layer --ops fwd --dtypes float32,bfloat16 --hiddens 8192,16384,32768 --no-torch --rep 30"
for r in 1 2; do
  (cd abm && PYTHONPATH=. timeout 60 python experiments/norm_sweep.py $A --name ln_lean_tree_$r > /dev/null 2>&1)
  cp abm/experiments/results/ln_lean_tree_$r.* experiments/results/ 2>/dev/null
  timeout 60 python experiments/norm_sweep.py $A --name ln_lean_here_$r > /dev/null 2>&1
done
python - <<'PY'
import json
def load(n):
    d = json.load(open(f"experiments/results/{n}.json"))
    return {(r["dtype"], r["hidden"]): r for r in d["rows"] if r["impl"] == "cuflash"}, \
           {(r["dtype"], r["hidden"]): r for r in d["rows"] if r["impl"] == "triton"}
for r in (1, 2):
    t, _ = load(f"ln_lean_tree_{r}"); h, tri = load(f"ln_lean_here_{r}")
    for k in sorted(h):
        print(r, k, "tree %.3f here %.3f x%.3f  triton %.3f  err %.2g / %.2g" % (t[k]["frac_copy"], h[k]["frac_copy"],
              h[k]["frac_copy"] / t[k]["frac_copy"], tri[k]["frac_copy"] if k in tri else float("nan"),
              t[k]["max_abs_err"], h[k]["max_abs_err"]))
PY
pack; el ab
