#!/usr/bin/env bash
# Probe (scratch, #4, wip/ln-fwd-lean): same-run A/B of bfloat16 LayerNorm forward rows on norm_fwd (the register
# kernel: hidden 1K-16K; fused residual up to 8K) with to_floats against main's tree (abm/), three rounds.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/ln_fwd_lean_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
norm_vs_tree ln_fwd_lean 3 "--kinds layer --ops fwd,fwd_res --dtypes bfloat16 --hiddens 1024,2048,4096,8192,16384 --no-torch --no-triton --rep 30"
