#!/usr/bin/env bash
# One device call for #9: WIDE_SEQLEN (the Br = 192, Bc = 128 default at head_dim 64 from this many queries and keys).
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_wide_call.sh      (carry [".kc"])
# 1. A/B: the default tile (A: Br = 192 from WIDE_SEQLEN, the Br = 64 tile below) against (64, 128) (B),
#    interleaved, cuDNN in the same run, head_dim 64, 512-2048, both dtypes (A = B below WIDE_SEQLEN: the noise);
# 2. the Hopper forward and attention tests, recorded in experiments/results/h200_wide_tests.json.
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
for dt in bfloat16 float16; do
  timeout 120 python experiments/scratch/fwd_variant_ab.py --a tma --b tma --b-blocks 64 128 --head-dims 64 \
    --seqlens 512 768 1024 1536 2048 --rep 30 --dtype $dt --name fwd_wide_ab_$dt 2>&1 | tail -12
  pack; el "ab $dt"
done
CUFLASH_GPU_RECORD=experiments/results/h200_wide_tests.json timeout 300 python -m pytest -q -n 15 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_attention_sm90.py tests/test_attention.py 2>&1 | tail -4
pack; el tests
