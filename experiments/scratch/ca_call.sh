#!/usr/bin/env bash
# Device call (#3, #4): experiments/scratch/ca_ab.py in main's tree (abm/: ab_tree.sh with MATCH="" for every
# kernel, or the sources the probe uses) and here, ROUNDS interleaved; carry ["abm", ".kc"].
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
probe_vs_tree ca_ab.py ca "${ROUNDS:-2}" 150
python - <<'PY'
import glob, json
def load(p):
    return {(r["op"], r["dtype"], r["n"]): r for r in json.load(open(p))["rows"]}
t = [load(p) for p in sorted(glob.glob("experiments/results/ca_tree_*.json"))]
h = [load(p) for p in sorted(glob.glob("experiments/results/ca_here_*.json"))]
print("op dtype n | tree rounds | here rounds | here/tree (best) | err tree / here")
for k in h[0]:
    a = [x[k]["frac_copy"] for x in t]; b = [x[k]["frac_copy"] for x in h]
    print(*k, "|", " ".join("%.3f" % v for v in a), "|", " ".join("%.3f" % v for v in b),
          "| x%.3f" % (max(b) / max(a)), "| %.2g / %.2g" % (t[0][k]["err"], h[0][k]["err"]))
PY
