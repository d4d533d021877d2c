#!/usr/bin/env bash
# One device call for the cluster forward (norm_fwd_cluster): warm norm.cu, compute-sanitizer memcheck/synccheck
# on small calls (SAN_TOOLS), test_norm (record h200_norm_tests.json), the whole norm sweep, then the forward (AB_ARGS: norm_sweep arguments) with
# the cluster path off (norm_sweep_nocluster) and (unless NO_CL1024) from 1024 vectors (norm_sweep_cl1024).
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_cluster_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python experiments/scratch/warm.py norm.cu 2>&1 | tail -1
for tool in ${SAN_TOOLS:-memcheck synccheck}; do
  timeout 60 compute-sanitizer --tool $tool python experiments/scratch/fwd_cluster_san.py 2>&1 | tail -3
done
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_norm_tests.json timeout 240 \
  python -m pytest -q -n 14 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_norm.py 2>&1 | tail -8
tar czf "$OUT/r.tgz" experiments/results plots  # again at the end: what ran comes back if time runs out
timeout 200 python experiments/norm_sweep.py 2>&1 | grep -v "it/s" | tail -2
tar czf "$OUT/r.tgz" experiments/results plots
source experiments/scratch/ab.sh
cp plots/norm_bandwidth.png /tmp/nb.png
AB_ARGS=${AB_ARGS:---ops fwd,fwd_res --hiddens 4096,8192,16384,32768}
ab norm_sweep_nocluster "n.FWD_CLUSTER_SIZES = ()" "$AB_ARGS"
[ -z "${NO_CL1024:-}" ] && ab norm_sweep_cl1024 "n.FWD_CLUSTER_MIN_VECS = 1024" "$AB_ARGS"
cp /tmp/nb.png plots/norm_bandwidth.png  # the A/B runs redraw it from their rows
tar czf "$OUT/r.tgz" experiments/results plots
for f in norm_sweep norm_sweep_nocluster $([ -z "${NO_CL1024:-}" ] && echo norm_sweep_cl1024); do
  echo "== $f"; python experiments/scratch/norm_rows.py experiments/results/$f.json | grep -v "^bwd" | awk '$4 >= 4096'
done
