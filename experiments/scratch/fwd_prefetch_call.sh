#!/usr/bin/env bash
# One device call for wip/norm-hold-prefetch (FWD_CLUSTER_PREFETCH: the held cluster forward loads its next row's
# share while this one is reduced and written): warm norm.cu, compute-sanitizer synccheck + memcheck on small
# calls (prefetch), test_norm (record h200_norm_tests.json), then the forward at 8K-32K (and bf16 64K) with
#   norm_sweep_pf(3)   plain LayerNorm and RMSNorm, held cluster path with prefetch (LayerNorm 2 / 3 blocks an SM),
#   norm_sweep_hold    the same without prefetch,
#   norm_sweep_base    the release settings,
# all on one machine, torch left out. About 420 s plus start-up on a cold machine (the warm-up is 135-180 s).
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/fwd_prefetch_call.sh
# With the kernel cache carried (carry [".kc"], as gpu_run.sh) the warm-up loads instead of compiling, and the
# test_norm step is left to the full suite (SKIP_TESTS=1).
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.kcache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$CUPY_CACHE_DIR"
ls .kc/kc.tgz.* >/dev/null 2>&1 && cat .kc/kc.tgz.* | tar xzf - -C "$CUPY_CACHE_DIR"
python experiments/scratch/warm.py norm.cu 2>&1 | tail -1
for tool in synccheck memcheck; do  # (prefetch3 differs in launch bounds only)
  timeout 60 compute-sanitizer --tool $tool python experiments/scratch/fwd_cluster_san.py prefetch 2>&1 | tail -1
done
[ "${SKIP_TESTS:-0}" = 1 ] || CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_norm_tests.json timeout 240 \
  python -m pytest -q -n 14 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_norm.py 2>&1 | tail -4
tar czf "$OUT/r.tgz" experiments/results plots
source experiments/scratch/ab.sh
cp plots/norm_bandwidth.png /tmp/nb.png
A="--ops fwd --hiddens 8192,16384,32768 --no-triton"
ab norm_sweep_pf "n.FWD_CLUSTER_HOLD = n.FWD_CLUSTER_PLAIN_LAYER = True; n.FWD_CLUSTER_PREFETCH = 2" "$A"
ab norm_sweep_pf3 "n.FWD_CLUSTER_HOLD = n.FWD_CLUSTER_PLAIN_LAYER = True; n.FWD_CLUSTER_PREFETCH = 3" "$A"
ab norm_sweep_hold "n.FWD_CLUSTER_HOLD = n.FWD_CLUSTER_PLAIN_LAYER = True" "$A"
ab norm_sweep_base "pass" "$A"
ab ln64k_pf "n.FWD_CLUSTER_HOLD = n.FWD_CLUSTER_PLAIN_LAYER = True; n.FWD_CLUSTER_PREFETCH = 2" \
  "--ops fwd --hiddens 65536 --dtypes bfloat16 --no-triton"
ab ln64k_base "pass" "--ops fwd --hiddens 65536 --dtypes bfloat16 --no-triton"
cp /tmp/nb.png plots/norm_bandwidth.png  # the A/B runs redraw it from their rows
tar czf "$OUT/r.tgz" experiments/results plots
for f in norm_sweep_pf norm_sweep_pf3 norm_sweep_hold norm_sweep_base ln64k_pf ln64k_base; do
  echo "== $f"; python experiments/scratch/norm_rows.py experiments/results/$f.json | grep "^fwd "
done
