#!/usr/bin/env bash
# One device call for wip/combo2: the softmax and validation tests (with the racecheck test), then the planner's
# other partitions at the rows block_state lost on (bf16 32K, C = 1; float32 128K, C = 8) and their neighbours.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/combo2_tune_call.sh, carry [".kc"]
. experiments/scratch/_call_env.sh
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_softmax_tests.json timeout 200 python -m pytest -q \
  -n 15 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_softmax.py tests/test_validation.py 2>&1 | tail -4
timeout 150 python experiments/softmax_sweep.py --cols 32768,65536,131072 --dtypes bfloat16,float32 --methods online \
  --no-peers --rep 30 --tune --name sm_bs2_tune 2>&1 | grep -v "it/s" | tail -30
python - <<'PY'
import json
d = json.load(open("experiments/results/sm_bs2_tune.json"))
for r in d["rows"]:
    if r["impl"].startswith("cuflash"):
        print(r["dtype"], r["cols"], r["impl"], r["method"], r.get("path"), r.get("chunks"), "%.3f" % r["frac_of_copy"])
PY
pack
