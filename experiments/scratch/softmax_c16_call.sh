#!/usr/bin/env bash
# One device call for wip/softmax-c16 (#3; on top of wip/softmax-tidy): the softmax and validation tests (the tidy
# branch's kernel change included, and the study size C = 16), then the probe of 1-4 MiB rows at C = 8 and 16
# (non-portable clusters, 64 KiB held a block by default, the rest streamed) against the planner's choice.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/softmax_c16_call.sh, carry [".kc"] (softmax kernels built by
#   experiments/kcache_offline.py --match softmax from a worktree of this commit)
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_softmax_tests.json timeout 150 python -m pytest -q \
  -n 15 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_softmax.py tests/test_validation.py 2>&1 | tail -3
pack; el tests
timeout 60 python experiments/scratch/softmax_pipe_probe.py --dtypes float32 --sizes 8,16 --holds 98304 \
  --cols 262144,524288,1048576 --name softmax_c16_probe_float32 2>&1 | grep -v Warn | tail -4
timeout 60 python experiments/scratch/softmax_pipe_probe.py --dtypes bfloat16 --sizes 8,16 --holds 98304 \
  --cols 524288,1048576 --name softmax_c16_probe_bfloat16 2>&1 | grep -v Warn | tail -3
pack; el probe
