#!/usr/bin/env bash
# One device call for fix/validate-first (argument checks moved before the device query): the softmax, validation
# and attention forward tests on the H200 (kernels as main's).   CUFLASH_COMMIT=<hash> bash ..., carry [".kc"]
. experiments/scratch/_call_env.sh
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_validate_first_tests.json timeout -s INT 150 \
  python -m pytest -q -n 15 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_softmax.py \
  tests/test_validation.py tests/test_attention.py 2>&1 | grep -v "^SKIPPED" | tail -4
pack
