#!/usr/bin/env bash
# Device call of the LayerNorm shift A/B: experiments/scratch/ln_shift_ab.py against main's tree (abm/, built by
# MATCH=norm_fwd experiments/scratch/ab_tree.sh), ROUNDS interleaved rounds; carry ["abm", ".kc"].
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
probe_vs_tree ln_shift_ab.py ln_shift "${ROUNDS:-3}"
python - <<'PY'
import glob, json
def load(p):
    return {(r["kind"], r["dtype"], r["hidden"], r["affine"], r["residual"], r["pattern"], r["force"]): r
            for r in json.load(open(p))["rows"]}
t = [load(p) for p in sorted(glob.glob("experiments/results/ln_shift_tree_*.json"))]
h = [load(p) for p in sorted(glob.glob("experiments/results/ln_shift_here_*.json"))]
print("case | path | tree rounds | here rounds | here/tree (medians) | err tree / here | rstd rel err tree / here")
for k in h[0]:
    a = sorted(x[k]["frac_copy"] for x in t); b = sorted(x[k]["frac_copy"] for x in h)
    print(" ".join(map(str, k)), "|", h[0][k]["path"], "|", " ".join("%.3f" % v for v in a), "|",
          " ".join("%.3f" % v for v in b), "| x%.3f" % (b[len(b) // 2] / a[len(a) // 2]),
          "| %.2g / %.2g" % (t[0][k]["max_abs_err"], h[0][k]["max_abs_err"]),
          "| %.2g / %.2g" % (t[0][k]["rstd_rel_err"], h[0][k]["rstd_rel_err"]))
PY
