#!/usr/bin/env bash
# Same-run A/B of the backward: this checkout against the tree in abm/ (experiments/scratch/ab_tree.sh), bf16,
# head_dim 64 / 128, seqlen 512-16K, the two interleaved ROUNDS times (default 2), no torch peers. Results:
# experiments/results/bwd_vs_tree_{tree,here}_<round>.json, packed into $OUT/ab.tgz. Carry ["abm", ".kc"].
# HERE2='<statement on cuflash.attention_bwd as ab>': a third configuration of this checkout (bwd_vs_tree_here2_*).
#   CUFLASH_COMMIT=<hash> [HERE2='ab.SM90_DQ_FIXED = True'] bash experiments/scratch/bwd_vs_tree_call.sh
set -u
export MPLBACKEND=Agg PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.kcache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$CUPY_CACHE_DIR" experiments/results
ls .kc/kc.tgz.* >/dev/null 2>&1 && cat .kc/kc.tgz.* | tar xzf - -C "$CUPY_CACHE_DIR"
B="--dtypes bfloat16 --seqlens 512 1024 4096 16384 --rep 20 --warmup 3 --no-torch"
for r in $(seq "${ROUNDS:-2}"); do
  (cd abm && PYTHONPATH=. CUFLASH_COMMIT=$(cat COMMIT) timeout 90 python experiments/attention_bwd_bench.py $B \
     --name bwd_vs_tree_tree_$r 2>&1 | grep -v cfg/s | tail -2)
  PYTHONPATH=. timeout 90 python experiments/attention_bwd_bench.py $B --name bwd_vs_tree_here_$r 2>&1 | grep -v cfg/s | tail -2
  [ -n "${HERE2:-}" ] && PYTHONPATH=. timeout 90 python -c "import runpy, sys; import cuflash.attention_bwd as ab; $HERE2
sys.argv = ['attention_bwd_bench.py'] + '$B --name bwd_vs_tree_here2_$r'.split()
runpy.run_path('experiments/attention_bwd_bench.py', run_name='__main__')" 2>&1 | grep -v cfg/s | tail -2
  cp abm/experiments/results/bwd_vs_tree_tree_* experiments/results/ 2>/dev/null
  tar czf "$OUT/ab.tgz" experiments/results/bwd_vs_tree_*
done
python - <<'PY'
import glob, json
def rows(p):
    return {(r["head_dim"], r["seqlen"], r["causal"]): r for r in json.load(open(p))["rows"]}
t = [rows(p) for p in sorted(glob.glob("experiments/results/bwd_vs_tree_tree_*.json"))]
h = [rows(p) for p in sorted(glob.glob("experiments/results/bwd_vs_tree_here_*.json"))]
h2 = [rows(p) for p in sorted(glob.glob("experiments/results/bwd_vs_tree_here2_*.json"))]
print("head_dim seqlen causal | bwd TFLOP/s tree / here | here / tree (wgmma, mma.sync Bc 128) | here2 / tree (wgmma)")
for k in t[0]:
    f = lambda rs, c: sum(r[k][c] for r in rs) / len(rs)
    print(*k, "|", round(f(t, "cuflash_bwd_tflops")), round(f(h, "cuflash_bwd_tflops")), "|",
          round(f(h, "cuflash_bwd_tflops") / f(t, "cuflash_bwd_tflops"), 3),
          round(f(h, "cuflash_bwd_bc128_tflops") / f(t, "cuflash_bwd_bc128_tflops"), 3), "|",
          round(f(h2, "cuflash_bwd_tflops") / f(t, "cuflash_bwd_tflops"), 3) if h2 else "")
PY
