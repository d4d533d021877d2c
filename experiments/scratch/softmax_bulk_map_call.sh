# Device call (#3): softmax_bulk_map.py in main's tree (abm/: cp.async), this one (bulk copies, P = 4) and abp/ (bulk,
# P = 8), ROUNDS rounds interleaved; prints the median fraction of copy per (dtype, cols, C) for each tree.
. experiments/scratch/_call_env.sh
R=${1:-3}
for r in $(seq "$R"); do
  for t in abm . abp; do
    n=bulkmap_$(basename $(cd $t && pwd))_$r
    (cd $t && timeout 100 python $( [ $t = . ] && echo experiments || echo ../experiments )/scratch/softmax_bulk_map.py "$n" 2>&1 | tail -2)
    [ $t != . ] && cp $t/experiments/results/$n.json experiments/results/
  done
done
pack
python - "$R" <<'PY'
import json, statistics, sys, glob
R = int(sys.argv[1])
def load(tree):
    out = {}
    for p in glob.glob(f"experiments/results/bulkmap_{tree}_*.json"):
        for r in json.load(open(p))["rows"]:
            out.setdefault((r["dtype"], r["cols"], r["C"]), []).append(r)
    return out
trees = {"cp.async": load("abm"), "bulk4": load("main"), "bulk8": load("abp")}
print("dtype cols C(auto*) | cp.async bulk4 bulk8 (median frac of copy) | bulk4/cp bulk8/cp | err")
for k in sorted(trees["cp.async"], key=lambda k: (k[0], k[1], k[2])):
    f = {n: statistics.median(r["frac_of_copy"] for r in t[k]) for n, t in trees.items() if k in t}
    r0 = trees["cp.async"][k][0]
    star = "*" if r0["auto"] == k[2] and r0["auto_path"] == "cluster" else ""
    err = max(r["max_rel_err"] for t in trees.values() for r in t.get(k, []))
    print(k[0], k[1], f"{k[2]}{star}", "|", " ".join("%.3f" % f.get(n, 0) for n in trees), "|",
          " ".join("%.3f" % (f.get(n, 0) / f["cp.async"]) for n in ("bulk4", "bulk8")), "| %.1e" % err)
PY
