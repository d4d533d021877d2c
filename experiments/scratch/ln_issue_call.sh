#!/usr/bin/env bash
# Device call (#4): Nsight Compute L2 read sectors of norm_fwd_stream here (its copy variant), then the
# same-run A/B against main's tree (abm/, MATCH=norm_fwd experiments/scratch/ab_tree.sh), ROUNDS interleaved;
# carry ["abm", ".kc"].
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
TIME=0 CASES="bfloat16 32768 2;float32 16384 2" bash experiments/scratch/norm_stream_l2_ncu.sh
probe_vs_tree ln_issue_ab.py ln_issue "${ROUNDS:-3}" 100
