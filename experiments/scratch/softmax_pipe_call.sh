#!/usr/bin/env bash
# One device call for wip/softmax-pipe (#3): the softmax tests, then the probe (experiments/scratch/
# softmax_pipe_probe.py) here and in abm/ (main's tree: experiments/scratch/ab_tree.sh), interleaved by dtype.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/softmax_pipe_call.sh, carry ["abm", ".kc"] (softmax kernels of
#   both trees built by experiments/kcache_offline.py --match softmax: no warm-up of every kernel)
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_softmax_pipe_tests.json timeout 240 python -m pytest -q -n 15 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_softmax.py 2>&1 | tail -4
pack; el tests
for d in ${DTYPES:-bfloat16 float32}; do
  (cd abm && PYTHONPATH=. timeout 120 python ../experiments/scratch/softmax_pipe_probe.py --dtypes $d \
     --name softmax_probe_main_$d 2>&1 | tail -9)
  cp abm/experiments/results/softmax_probe_main_* experiments/results/ 2>/dev/null
  timeout 120 python experiments/scratch/softmax_pipe_probe.py --dtypes $d --name softmax_probe_here_$d 2>&1 | tail -9
  pack; el "probe $d"
done
