#!/usr/bin/env bash
# One device call for wip/combo2 (wip/ln-fwd-lean + wip/softmax-blockstate with two barriers a row): a same-run
# A/B of the softmax cluster rows against main's tree (abm/), two rounds, then the GPU record (the full suite, with
# the racecheck test of the cluster kernel) and the norm and softmax sweeps.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/combo2_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
A="--cols 16384,32768,65536,131072,262144,524288 --dtypes float32,bfloat16 --methods online --no-peers --rep 30"
for r in 1 2; do
  (cd abm && PYTHONPATH=. timeout 90 python experiments/softmax_sweep.py $A --name sm_bs2_tree_$r > /dev/null 2>&1)
  cp abm/experiments/results/sm_bs2_tree_$r.* experiments/results/ 2>/dev/null
  timeout 90 python experiments/softmax_sweep.py $A --name sm_bs2_here_$r > /dev/null 2>&1
done
python - <<'PY'
import json
def load(n):
    d = json.load(open(f"experiments/results/{n}.json"))
    return {(r["dtype"], r["cols"]): r for r in d["rows"] if r["impl"] == "cuflash"}
for r in (1, 2):
    t, h = load(f"sm_bs2_tree_{r}"), load(f"sm_bs2_here_{r}")
    for k in sorted(h):
        print(r, k, h[k]["path"], h[k]["chunks"], "tree %.3f here %.3f x%.3f  rel err %.2g / %.2g" % (
              t[k]["frac_of_copy"], h[k]["frac_of_copy"], h[k]["frac_of_copy"] / t[k]["frac_of_copy"],
              t[k]["max_rel_err"], h[k]["max_rel_err"]))
PY
DEADLINE=${DEADLINE:-480} TEST_TIMEOUT=${TEST_TIMEOUT:-330} \
  BENCH="python experiments/norm_sweep.py;python experiments/softmax_sweep.py" \
  bash experiments/gpu_run.sh h200 -- -n 15 --deselect tests/test_compile.py::test_every_declared_kernel_compiles_without_spills \
  | tail -60
rm -f "$OUT"/kc.tgz.* "$OUT"/junit.xml
