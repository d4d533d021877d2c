#!/usr/bin/env bash
# The GPU record: run on the H200 (device tool) from the repo root. Runs the whole test suite (GPU tests
# included) and the named benchmark/experiment commands, writes the record to experiments/results/, and packs
# results + plots into $OUT/results.tgz for the checkout to commit.
#   usage: bash experiments/gpu_run.sh [TAG] [-- extra pytest args]
# Environment: TEST_TIMEOUT (default 540 s: the full suite took ~370 s with -n 14 on the H200 at 5b8c90e, before
# the kernel-cache warm-up and the single canary); BENCH='cmd1;cmd2;...' benchmark commands run after the tests,
# one at a time (each under `timeout`);
# the pytest-benchmark files (tests/*_bench.py) are left out of the parallel test run: timings need the GPU alone.
set -u
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
tag=${1:-gpu}; shift || true
[ "${1:-}" = "--" ] && shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" experiments/results plots
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"
start=$(date +%s)
CUFLASH_GPU_RECORD=experiments/results/${tag}_tests.json timeout ${TEST_TIMEOUT:-540} \
  python3 -m pytest -q --maxfail=60 -p no:cacheprovider -o addopts="-ra --benchmark-disable" --ignore-glob="*_bench.py" \
  --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log" | grep -v "^tests/.* PASSED" | tail -n 80
echo "tests took $(( $(date +%s) - start )) s"
IFS=';' read -ra cmds <<< "${BENCH:-}"
pack() { tar czf "$OUT/results.tgz" experiments/results experiments/REPORT.md plots 2>/dev/null; }
pack
for c in "${cmds[@]}"; do
  [ -z "$c" ] && continue
  left=$(( ${DEADLINE:-100000} - ($(date +%s) - start) ))
  if [ "$left" -lt 20 ]; then echo "=== skipped (deadline): $c"; continue; fi
  lim=${BENCH_TIMEOUT:-240}; [ "$lim" -gt "$left" ] && lim=$left
  echo "=== $c"; s=$(date +%s)
  timeout "$lim" bash -c "$c" 2>&1 | tee -a "$OUT/bench.log" | grep -v "it/s\|s/it\|cfg/s\|%|" | tail -n 25
  echo "=== rc=${PIPESTATUS[0]} took $(( $(date +%s) - s )) s"
  pack
done
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob("experiments/results/*_tests.json")):
    r = json.load(open(f)); print(f, r["counts"], r["environment"].get("gpu"), r["environment"].get("commit"))
PY
