#!/usr/bin/env bash
# One device call for wip/next17 (not yet run on a GPU): the Hopper forward's per-row mask bounds and wgmma
# descriptors advanced by one add (#9; the descriptors also in the wgmma backward), the FA-2 forward's mask
# bounds, and the staged LayerNorm weights (#4, study setting FWD_CLUSTER_LAYER_STAGED). The backward's same-run
# A/B against the same abm/ tree: experiments/scratch/bwd_vs_tree_call.sh. Before the call, on this machine:
#   bash experiments/scratch/ab_tree.sh 714211d /tmp/kcN        # abm/ = main's tree, its attention kernels cached
#   python experiments/kcache_offline.py /tmp/kcN --jobs 2       # this tree's kernels (from a worktree of HEAD)
#   (cd /tmp/kcN && tar czf - . | split -b 15m - ../path/to/.kc/kc.tgz.)
# then, carrying ["abm", ".kc"]:   CUFLASH_COMMIT=<hash> bash experiments/scratch/next17_call.sh
# 1. the tests the change touches (every masked shape of the sm90 forward, every configuration, GQA; the norm
#    cluster plans and edges), recorded in experiments/results/h200_next17_tests.json;
# 2. same-run A/B of the forward: main's tree (abm/) against this one, attention_bench.py twice each, interleaved
#    (cuDNN and FLASH in every run): experiments/results/fwd_vs_tree_{tree,here}_<round>.json;
# 3. ln_affine_probe.py on the default paths and with FWD_CLUSTER_LAYER_STAGED=4 (A/B; STAGEW lost and was
#    removed after this run at 266b6e8, so step 3 now fails on --set).
# Then the full suite (experiments/gpu_run.sh) before landing.
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_GPU_RECORD=experiments/results/h200_next17_tests.json timeout 240 python -m pytest -q -n 15 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_attention_sm90.py tests/test_norm.py \
  -k "tails_and_masks or every_configuration or gqa or cluster or default_tile_for_long" 2>&1 | tail -3
pack; el tests
fwd_vs_tree 2  # (_call_env.sh)
el ab
for s in "" "FWD_CLUSTER_LAYER_STAGED=4"; do
  timeout 60 python experiments/scratch/ln_affine_probe.py --hidden 8192 16384 32768 65536 \
    --name ln_stagew_probe${s:+_staged} ${s:+--set $s} 2>&1 | tail -10
done
pack; el probe
