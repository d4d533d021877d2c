#!/usr/bin/env bash
# One device call for wip/ln-stream-lean (#4): the norm and validation tests, then a same-run A/B of the LayerNorm
# forward rows on norm_fwd_stream (float32 16K, bfloat16 32K with weight and bias; and the rows around them)
# against main's tree (abm/), interleaved twice.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/ln_lean_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_norm_tests.json timeout 200 python -m pytest -q \
  -n 15 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_norm.py tests/test_validation.py 2>&1 | tail -3
pack; el tests
norm_vs_tree ln_lean 2 "--kinds layer --ops fwd --dtypes float32,bfloat16 --hiddens 8192,16384,32768 --no-torch --rep 30"
el ab
