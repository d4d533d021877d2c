#!/usr/bin/env bash
# The GPU record: run on the H200 (device tool) from the repo root. Runs the whole test suite (GPU tests
# included) and the named benchmark/experiment commands, writes the record to experiments/results/, and packs
# results + plots into $OUT/results.tgz for the checkout to commit.
#   usage: bash experiments/gpu_run.sh [TAG] [-- extra pytest args]
# Environment: TEST_TIMEOUT (default 540 s for the whole run: the full suite took 172 s of tests with -n 15 at
# 6099e3e after ~10 s of warm-up from a carried cache; 255 s of warm-up when it compiles everything); ITEM_TIMEOUT (default 150 s):
# pytest-timeout's limit per test (thread method: a test stuck in a kernel fails alone and its worker restarts,
# instead of the whole record being lost); BENCH='cmd1;cmd2;...' benchmark commands run after the tests, one at a
# time (each under `timeout`); the pytest-benchmark files (tests/*_bench.py) are left out of the parallel test
# run: timings need the GPU alone.
# Kernel cache: CuPy's cache is .kcache/ in the checkout; pieces .kc/kc.tgz.* (carry: [".kc"]) are unpacked into
# it first, and the cache is packed back into $OUT/kc.tgz.* at the end (copy them to .kc/ for the next call: the
# cubins are keyed on the cuda_src/ hash, so they serve any later call with the same kernel sources).
set -u
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.kcache}
tag=${1:-gpu}; shift || true
[ "${1:-}" = "--" ] && shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" experiments/results plots "$CUPY_CACHE_DIR"
# A warm machine may still hold a killed run's pytest and its xdist (execnet) workers, one stuck in a kernel
pkill -9 -f '^[^ ]*python[0-9.]* (-m pytest|-c import sys;exec)' 2>/dev/null || true
ls .kc/kc.tgz.* >/dev/null 2>&1 && cat .kc/kc.tgz.* | tar xzf - -C "$CUPY_CACHE_DIR" && echo "kernel cache: $(ls "$CUPY_CACHE_DIR" | wc -l) entries carried in"
# SOURCE_HASHES in the cache: the cuda_src/ hashes whose every declared kernel it holds (kcache_offline.py, and this
# script after a run). A cache built for other sources misses on every kernel (the hash is in their options).
src_hash=$(python3 -c "from cuflash import _compile; print(_compile.source_hash())" 2>/dev/null)
[ -z "$src_hash" ] || grep -qx "$src_hash" "$CUPY_CACHE_DIR/SOURCE_HASHES" 2>/dev/null \
  || echo "WARNING: no carried kernel cache for cuda_src/ $src_hash: the warm-up compiles every kernel (~150 s at -n 15)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"
per_item=()
python3 -c "import pytest_timeout" 2>/dev/null && per_item=(--timeout="${ITEM_TIMEOUT:-150}" --timeout-method=thread)
# With -n: worksteal scheduling (xdist >= 3.2) lets idle workers take queued tests from busy ones; under the default
# a worker kept a run of slow parametrized tests (the 6099e3e suite: 172 s with it, 551 s at f4e4319 without)
case " $* " in *" -n "*|*" -n"[0-9]*) case " $* " in *" --dist"*) ;; *)
  python3 -c "import xdist, sys; sys.exit(tuple(map(int, xdist.__version__.split('.')[:2])) < (3, 2))" 2>/dev/null \
    && per_item+=(--dist worksteal) ;; esac ;; esac
start=$(date +%s)
# SIGINT at the limit: pytest stops as on Ctrl-C and still writes the record (exitstatus 2, the counts so far)
CUFLASH_GPU_RECORD=experiments/results/${tag}_tests.json timeout -s INT -k 30 ${TEST_TIMEOUT:-540} \
  python3 -m pytest -q --maxfail=60 -p no:cacheprovider -o addopts="-ra --benchmark-disable" --ignore-glob="*_bench.py" \
  --durations=30 "${per_item[@]}" --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log" \
  | grep -v "^tests/.* PASSED" | tail -n 80
echo "tests took $(( $(date +%s) - start )) s"
# (recorded only once the suite's warm-up, which compiles every declared kernel, has finished)
if [ -n "$src_hash" ] && grep -Eq "^kernel cache warm-up: [0-9]+ kernels" "$OUT/pytest.log" 2>/dev/null \
   && ! grep -q "^kernel cache warm-up: a compile process failed" "$OUT/pytest.log"; then
  grep -qx "$src_hash" "$CUPY_CACHE_DIR/SOURCE_HASHES" 2>/dev/null || echo "$src_hash" >> "$CUPY_CACHE_DIR/SOURCE_HASHES"
fi
(cd "$CUPY_CACHE_DIR" && tar czf - . | split -b 15m - "$OUT/kc.tgz.")  # for the next call (see above)
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
