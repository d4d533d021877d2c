#!/usr/bin/env bash
# A second source tree for same-run A/Bs on the device: abm/ = cuflash/, cuda_src/ and experiments/*.py of COMMIT
# (git archive), and its attention kernels in the offline kernel cache under the device path /work/main/abm, added
# to DIR (then pack DIR into .kc/ as kcache_offline.py says). abm/ is in .git/info/exclude: carry ["abm", ".kc"].
# On the device: (cd abm && PYTHONPATH=. python experiments/attention_bwd_bench.py ...) beside the same command
# from the root (experiments/scratch/bwd_vs_tree_call.sh).
#   bash experiments/scratch/ab_tree.sh COMMIT DIR
set -eu
commit=$1; dir=$2
rm -rf abm /tmp/abm_wt && mkdir -p abm/experiments/results abm/plots
git archive "$commit" cuflash cuda_src experiments | tar xf - -C abm
rm -rf abm/experiments/scratch abm/experiments/results/* && git rev-parse --short "$commit" > abm/COMMIT
git worktree add -f /tmp/abm_wt "$commit" -q
# this checkout's script, run from the worktree (it imports the cuflash beside it: the tree's declared kernels)
cp experiments/kcache_offline.py /tmp/abm_wt/experiments/kcache_offline_ab.py
(cd /tmp/abm_wt && CUFLASH_DEVICE_ROOT=/work/main/abm python experiments/kcache_offline_ab.py "$dir" --match "${MATCH:-attention}")
git worktree remove --force /tmp/abm_wt
