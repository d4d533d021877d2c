# Sourced by the scratch device-call scripts: environment, the carried kernel cache, pack, and bwd_ab.
#   . experiments/scratch/_call_env.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.kcache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$CUPY_CACHE_DIR"
ls .kc/kc.tgz.* >/dev/null 2>&1 && cat .kc/kc.tgz.* | tar xzf - -C "$CUPY_CACHE_DIR"
pack() { tar czf "$OUT/r.tgz" experiments/results; }
# bwd_ab NAME STATEMENT [EXTRA]: the bwd bench (bf16, SEQLENS, default 1024 4096 16384) after STATEMENT on
# cuflash.attention_bwd (as ab), into experiments/results/NAME.json; T: its time limit (default 80 s).
bwd_ab() {
  timeout "${T:-80}" python -c "import runpy, sys; sys.path.insert(0, '.'); import cuflash.attention_bwd as ab; $2
sys.argv = ['attention_bwd_bench.py', '--dtypes', 'bfloat16', '--seqlens'] + '${SEQLENS:-1024 4096 16384}'.split() + [
            '--rep', '20', '--warmup', '3', '--name', '$1'] + '${3:-}'.split()
runpy.run_path('experiments/attention_bwd_bench.py', run_name='__main__')" 2>&1 | grep -v "cfg/s" | tail -14
  pack
}
