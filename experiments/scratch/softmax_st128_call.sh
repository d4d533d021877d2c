# Device call (#3): softmax_ops_ab.py in main's tree (abm/) and this one, ROUNDS rounds interleaved; prints the
# median fraction of copy per (dtype, cols, op) in each tree and their ratio.
. experiments/scratch/_call_env.sh
R=${1:-3}
for r in $(seq "$R"); do
  (cd abm && timeout 100 python ../experiments/scratch/softmax_ops_ab.py ops_tree_$r > /dev/null 2>&1)
  cp abm/experiments/results/ops_tree_$r.json experiments/results/
  timeout 100 python experiments/scratch/softmax_ops_ab.py ops_here_$r > /dev/null 2>&1
done
pack
python - "$R" <<'PY'
import json, statistics, sys
R = int(sys.argv[1])
def load(n):
    return [{(r["dtype"], r["cols"], r["op"]): r for r in json.load(open(f"experiments/results/{n}_{i}.json"))["rows"]}
            for i in range(1, R + 1)]
t, h = load("ops_tree"), load("ops_here")
print("dtype cols op path C | tree here (median frac of copy) | here/tree")
for k in t[0]:
    a = statistics.median(x[k]["frac_of_copy"] for x in t); b = statistics.median(x[k]["frac_of_copy"] for x in h)
    print(*k, t[0][k]["path"], t[0][k]["C"], "| %.3f %.3f | %.3f" % (a, b, b / a))
PY
