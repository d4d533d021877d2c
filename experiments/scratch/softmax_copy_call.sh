# Device call (#3): the GPU record of this commit (whole suite, softmax sweep) and a same-run A/B of the softmax
# sweep at the cluster rows against main's tree (abm/), two rounds.   bash ... COMMIT
C=$1
DEADLINE=420 TEST_TIMEOUT=300 CUFLASH_COMMIT=$C BENCH="python experiments/softmax_sweep.py" bash experiments/gpu_run.sh h200 -- \
  -n 15 --deselect tests/test_compile.py::test_every_declared_kernel_compiles_without_spills 2>&1 | tail -25
OUT=${OUT:-/tmp/out}; rm -f "$OUT"/kc.tgz.* "$OUT"/junit.xml
. experiments/scratch/_call_env.sh
softmax_vs_tree sm_copy 2 "--cols 32768,65536,131072,262144,524288,1048576 --methods online --no-peers"
