#!/usr/bin/env bash
# One device call for wip/fwd-192x128 (#9 at head_dim 64: the Br = 192, Bc = 128 tile of the 'tma' variant, three
# consumer warpgroups, FA-3's head_dim 64 tile; it spilled 40 bytes at 04b3ec5 and compiles without spills now).
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_192x128_call.sh      (carry [".kc"])
# 1. the default variant's tile tests (every tile on every tail shape and mask, every configuration, the TMA fallback,
#    bad inputs), recorded in experiments/results/h200_192x128_tests.json;
# 2. A/B: the default tile against (192, 128), interleaved, cuDNN in the same run, head_dim 64, both dtypes.
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_GPU_RECORD=experiments/results/h200_192x128_tests.json timeout 200 python -m pytest -q -n 15 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_attention_sm90.py tests/test_attention.py \
  -k "every_default_variant_tile or every_configuration or tma_fallback or bad_inputs_raise" 2>&1 | tail -4
pack; el tests
for dt in bfloat16 float16; do
  timeout 150 python experiments/scratch/fwd_variant_ab.py --a tma --b tma --b-blocks 192 128 --head-dims 64 \
    --seqlens 1024 2048 4096 8192 16384 --rep 20 --dtype $dt --name fwd_192x128_ab_$dt 2>&1 | tail -13
  pack; el "ab $dt"
done
