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
softmax_vs_tree sm_bulk2 3 "$A"
