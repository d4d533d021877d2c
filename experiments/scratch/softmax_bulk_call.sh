#!/usr/bin/env bash
# One device call for wip/softmax-bulk (#3): the softmax and validation tests (racecheck included), then a
# same-run A/B of the cluster rows (32K-1M columns, float32 and bfloat16, method online) against main's tree (abm/:
# experiments/scratch/ab_tree.sh with MATCH=softmax), three rounds interleaved.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/softmax_bulk_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_softmax_tests.json timeout 200 python -m pytest -q \
  -n 15 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_softmax.py tests/test_validation.py 2>&1 \
  | grep -v PASSED | tail -25
A="--cols 32768,65536,131072,262144,524288,1048576 --dtypes float32,bfloat16 --methods online --no-peers --rep 30"
for r in 1 2 3; do
  (cd abm && PYTHONPATH=. timeout 90 python experiments/softmax_sweep.py $A --name sm_bulk2_tree_$r > /dev/null 2>&1)
  cp abm/experiments/results/sm_bulk2_tree_$r.* experiments/results/ 2>/dev/null
  timeout 90 python experiments/softmax_sweep.py $A --name sm_bulk2_here_$r > /dev/null 2>&1
done
python - <<'PY'
import json
def load(n):
    d = json.load(open(f"experiments/results/{n}.json"))
    return {(r["dtype"], r["cols"]): r for r in d["rows"] if r["impl"] == "cuflash"}
for r in (1, 2, 3):
    t, h = load(f"sm_bulk2_tree_{r}"), load(f"sm_bulk2_here_{r}")
    for k in sorted(h):
        print(r, k, h[k]["path"], h[k]["chunks"], "tree %.3f here %.3f x%.3f  rel err %.2g / %.2g" % (
              t[k]["frac_of_copy"], h[k]["frac_of_copy"], h[k]["frac_of_copy"] / t[k]["frac_of_copy"],
              t[k]["max_rel_err"], h[k]["max_rel_err"]))
PY
pack
