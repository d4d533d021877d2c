#!/usr/bin/env bash
# One device call for wip/softmax-pipe (#3): the softmax tests (the cluster kernel at stages 1 and 2, C = 1..8,
# persistent and per-row clusters) and the probe (experiments/scratch/softmax_pipe_probe.py), float32 then bf16.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/softmax_pipe_call.sh, carry [".kc"] (softmax kernels built by
#   experiments/kcache_offline.py --match softmax: no warm-up of every kernel)
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_softmax_pipe_tests.json timeout 240 python -m pytest -q -n 15 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_softmax.py 2>&1 | tail -4
pack; el tests
timeout 250 python experiments/scratch/softmax_pipe_probe.py --dtypes ${DTYPES:-bfloat16,float32} 2>&1 | tail -24
pack; el probe
