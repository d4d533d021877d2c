#!/usr/bin/env bash
# One device call for wip/combo2 (wip/ln-fwd-lean + wip/softmax-blockstate with two barriers a row): a same-run
# A/B of the softmax cluster rows against main's tree (abm/), two rounds, then the GPU record (the full suite, with
# the racecheck test of the cluster kernel) and the norm and softmax sweeps.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/combo2_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
A="--cols 16384,32768,65536,131072,262144,524288 --dtypes float32,bfloat16 --methods online --no-peers --rep 30"
softmax_vs_tree sm_bs2 2 "$A"
DEADLINE=${DEADLINE:-480} TEST_TIMEOUT=${TEST_TIMEOUT:-330} \
  BENCH="python experiments/norm_sweep.py;python experiments/softmax_sweep.py" \
  bash experiments/gpu_run.sh h200 -- -n 15 --deselect tests/test_compile.py::test_every_declared_kernel_compiles_without_spills \
  | tail -60
rm -f "$OUT"/kc.tgz.* "$OUT"/junit.xml
