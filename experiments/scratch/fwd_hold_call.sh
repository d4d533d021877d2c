#!/usr/bin/env bash
# One device call for wip/fwd-cluster-hold (FWD_CLUSTER_HOLD: persistent norm_fwd_cluster, weights in shared
# memory): warm norm.cu, compute-sanitizer synccheck + memcheck on small calls (held and not), test_norm (record
# h200_norm_tests.json), the whole norm sweep (release settings), then the forward at 8K-32K with plain LayerNorm on
# the held cluster path (norm_sweep_hold) and with the cluster path off (norm_sweep_nocluster), same machine.
# About 330 s plus start-up on a cold machine (the norm.cu warm-up is 140-180 s of it).
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_hold_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python experiments/scratch/warm.py norm.cu 2>&1 | tail -1
for tool in synccheck memcheck; do
  for mode in "" hold; do
    timeout 60 compute-sanitizer --tool $tool python experiments/scratch/fwd_cluster_san.py $mode 2>&1 | tail -1
  done
done
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_norm_tests.json timeout 240 \
  python -m pytest -q -n 14 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_norm.py 2>&1 | tail -8
tar czf "$OUT/r.tgz" experiments/results plots
timeout 150 python experiments/norm_sweep.py 2>&1 | grep -v "it/s" | tail -1
tar czf "$OUT/r.tgz" experiments/results plots
source experiments/scratch/ab.sh
cp plots/norm_bandwidth.png /tmp/nb.png
ab norm_sweep_hold "n.FWD_CLUSTER_HOLD = n.FWD_CLUSTER_PLAIN_LAYER = True" "--ops fwd --hiddens 8192,16384,32768"
ab norm_sweep_nocluster "n.FWD_CLUSTER_SIZES = ()" "--ops fwd --hiddens 8192,16384,32768"
cp /tmp/nb.png plots/norm_bandwidth.png  # the A/B runs redraw it from their rows
tar czf "$OUT/r.tgz" experiments/results plots
for f in norm_sweep norm_sweep_hold norm_sweep_nocluster; do
  echo "== $f"; python experiments/scratch/norm_rows.py experiments/results/$f.json | grep "^fwd " | awk '$4 >= 8192'
done
