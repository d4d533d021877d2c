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
# fwd_vs_tree [ROUNDS]: same-run A/B of the forward, main's tree (abm/, experiments/scratch/ab_tree.sh) against this
# one, attention_bench.py ROUNDS times each (default 2), interleaved, cuDNN and FLASH in every run; prints here/tree
# (best of the rounds) and here x cuDNN: experiments/results/fwd_vs_tree_{tree,here}_<round>.json.
fwd_vs_tree() {
  for r in $(seq "${1:-2}"); do
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
}
# sweep_rounds SCRIPT NAME ROUNDS ARGS: experiments/SCRIPT ARGS in main's tree (abm/) and in this one, ROUNDS times
# interleaved, into experiments/results/NAME_{tree,here}_<round>.* (the loop of norm_vs_tree and softmax_vs_tree).
sweep_rounds() {
  for r in $(seq "$3"); do
    (cd abm && PYTHONPATH=. timeout 90 python "experiments/$1" $4 --name "$2_tree_$r" > /dev/null 2>&1)
    cp abm/experiments/results/"$2_tree_$r".* experiments/results/ 2>/dev/null
    timeout 90 python "experiments/$1" $4 --name "$2_here_$r" > /dev/null 2>&1
  done
}
# probe_vs_tree SCRIPT PREFIX ROUNDS [LIMIT]: experiments/scratch/SCRIPT PREFIX_{tree,here}_<round> with main's
# cuflash (abm/ on PYTHONPATH) and this one, ROUNDS times interleaved (LIMIT seconds each, default 120); results in
# experiments/results/, packed after each round (the loop of ln_shift_call.sh, ln_issue_call.sh, ca_call.sh).
probe_vs_tree() {
  for r in $(seq "$3"); do
    echo "== tree round $r"
    PYTHONPATH=$PWD/abm timeout "${4:-120}" python "experiments/scratch/$1" "$2_tree_$r"
    cp abm/experiments/results/"$2_tree_$r".* experiments/results/ 2>/dev/null
    echo "== here round $r"
    timeout "${4:-120}" python "experiments/scratch/$1" "$2_here_$r"
    pack
  done
}
# norm_vs_tree NAME ROUNDS ARGS: same-run A/B of experiments/norm_sweep.py ARGS, main's tree (abm/) against this one,
# ROUNDS times interleaved, into experiments/results/NAME_{tree,here}_<round>.json; prints tree / here fractions of
# copy and their ratio, with the max abs errors, per (op, kind, dtype, hidden).
norm_vs_tree() {
  sweep_rounds norm_sweep.py "$1" "$2" "$3"
  python - "$1" "$2" <<'PY'
import json, sys
def load(n):
    return {(r["op"], r["kind"], r["dtype"], r["hidden"]): r for r in json.load(open(f"experiments/results/{n}.json"))["rows"]
            if r["impl"] == "cuflash"}
for r in range(1, int(sys.argv[2]) + 1):
    t, h = load(f"{sys.argv[1]}_tree_{r}"), load(f"{sys.argv[1]}_here_{r}")
    for k in sorted(h):
        print(r, k, "tree %.3f here %.3f x%.3f  err %.2g / %.2g" % (t[k]["frac_copy"], h[k]["frac_copy"],
              h[k]["frac_copy"] / t[k]["frac_copy"], t[k]["max_abs_err"], h[k]["max_abs_err"]))
PY
  pack
}
# softmax_vs_tree NAME ROUNDS ARGS: same-run A/B of experiments/softmax_sweep.py ARGS (online rows), main's tree
# (abm/) against this one, ROUNDS times interleaved, into experiments/results/NAME_{tree,here}_<round>.json; prints
# tree / here fractions of copy and their ratio, with the max rel errors, per (dtype, cols), with the path and C.
softmax_vs_tree() {
  sweep_rounds softmax_sweep.py "$1" "$2" "$3"
  python - "$1" "$2" <<'PY'
import json, sys
def load(n):
    d = json.load(open(f"experiments/results/{n}.json"))
    return {(r["dtype"], r["cols"]): r for r in d["rows"] if r["impl"] == "cuflash"}
for r in range(1, int(sys.argv[2]) + 1):
    t, h = load(f"{sys.argv[1]}_tree_{r}"), load(f"{sys.argv[1]}_here_{r}")
    for k in sorted(h):
        print(r, k, h[k]["path"], h[k]["chunks"], "tree %.3f here %.3f x%.3f  rel err %.2g / %.2g" % (
              t[k]["frac_of_copy"], h[k]["frac_of_copy"], h[k]["frac_of_copy"] / t[k]["frac_of_copy"],
              t[k]["max_rel_err"], h[k]["max_rel_err"]))
PY
  pack
}
