#!/usr/bin/env bash
# One device call for wip/softmax-blockstate (#3): the softmax and validation tests, then a same-run A/B of the
# cluster-path rows (32K-512K columns, float32 and bfloat16, method online) against main's tree (abm/: set it up
# with the abm steps of experiments/scratch/ab_tree.sh, --match softmax), three rounds.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/softmax_blockstate_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_softmax_tests.json timeout 150 python -m pytest -q \
  -n 15 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_softmax.py tests/test_validation.py 2>&1 | tail -2
A="--cols 16384,32768,65536,131072,262144,524288 --dtypes float32,bfloat16 --methods online --no-peers --rep 30"
softmax_vs_tree sm_bs 3 "$A"
