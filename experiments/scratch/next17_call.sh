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
for r in 1 2; do
  (cd abm && PYTHONPATH=. CUFLASH_COMMIT=$(cat COMMIT) timeout 80 python experiments/attention_bench.py --rep 20 \
     --name fwd_vs_tree_tree_$r 2>&1 | tail -1)
  timeout 80 python experiments/attention_bench.py --rep 20 --name fwd_vs_tree_here_$r 2>&1 | tail -1
  cp abm/experiments/results/fwd_vs_tree_tree_* experiments/results/ 2>/dev/null
  pack
done
python - <<'PY'
import glob, json
def rows(p):
    return {(r["dtype"], r["head_dim"], r["seqlen"], r["causal"]): r for r in json.load(open(p))["rows"]}
t = [rows(p) for p in sorted(glob.glob("experiments/results/fwd_vs_tree_tree_*.json"))]
h = [rows(p) for p in sorted(glob.glob("experiments/results/fwd_vs_tree_here_*.json"))]
print("dtype head_dim seqlen causal | wgmma TFLOP/s tree / here (best of rounds) | here/tree | here x cuDNN")
for k in t[0]:
    a = max(x[k]["wgmma_tflops"] for x in t); b = max(x[k]["wgmma_tflops"] for x in h)
    c = max(x[k]["torch_cudnn_tflops"] for x in h + t)
    print(*k, f"| {a:.0f} / {b:.0f} | {b / a:.3f} | {b / c:.3f}")
PY
el ab
for s in "" "FWD_CLUSTER_LAYER_STAGED=4"; do
  timeout 60 python experiments/scratch/ln_affine_probe.py --hidden 8192 16384 32768 65536 \
    --name ln_stagew_probe${s:+_staged} ${s:+--set $s} 2>&1 | tail -10
done
pack; el probe
