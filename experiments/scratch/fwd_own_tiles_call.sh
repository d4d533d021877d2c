#!/usr/bin/env bash
# One device call for #9 (the Br = 192, Bc = 128 default at head_dim 64 and its per-warpgroup trailing-tile skip):
#   bash experiments/scratch/ab_tree.sh 669039c /tmp/kc_all    (abm/ = the tree without the skip; carry abm, .kc)
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_own_tiles_call.sh
# 1. A/B of the (192, 128) tile, abm/ (no skip) against this tree, two interleaved rounds, bfloat16 and float16;
# 2. the full test suite (experiments/gpu_run.sh, with attention_bench.py after it for the README table).
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
for r in 1 2; do
  (cd abm && PYTHONPATH=. timeout 100 python ../experiments/scratch/fwd_tile_tree_ab.py --dtypes bfloat16 float16 \
     --name own_tiles_tree_$r > /dev/null 2>&1; cp experiments/results/own_tiles_tree_$r.json ../experiments/results/)
  timeout 100 python experiments/scratch/fwd_tile_tree_ab.py --dtypes bfloat16 float16 --name own_tiles_here_$r > /dev/null 2>&1
  el "round $r"
done
python - <<'PY'
import json
def rows(p):
    return {(r["dtype"], r["seqlen"], r["causal"]): r["tflops"] for r in json.load(open(p))["rows"]}
t = [rows(f"experiments/results/own_tiles_tree_{r}.json") for r in (1, 2)]
h = [rows(f"experiments/results/own_tiles_here_{r}.json") for r in (1, 2)]
for k in t[0]:
    a, b = max(x[k] for x in t), max(x[k] for x in h)
    print(*k, f"tree {a:.0f} here {b:.0f} x{b / a:.3f}   rounds", [f"{x[k]:.0f}" for x in t], [f"{x[k]:.0f}" for x in h])
PY
pack
