#!/usr/bin/env bash
# One device call for a norm backward change: warm norm.cu's backward kernels, run test_norm's backward tests,
# then the backward part of the norm sweep (copy and torch in the same run). About 120 s after the machine starts.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_vpt_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python - <<'PY'
import json, subprocess, sys, time
from cuflash import _compile, norm
W = ("import json,sys\nfrom cuflash import _compile\n"
     "for s,n,o in json.load(sys.stdin): _compile.get_kernel(s,n,tuple(o))")
e = [(s, n, list(o)) for (s, n, o, _r) in _compile.declared() if s == "norm.cu" and ("bwd" in n or "reduce" in n)]
t0 = time.time()
chunks = [c for c in (e[i::15] for i in range(15)) if c]
ps = [subprocess.Popen([sys.executable, "-c", W], stdin=subprocess.PIPE, text=True) for _ in chunks]
for p, c in zip(ps, chunks):
    p.communicate(json.dumps(c))
print(f"warm: {len(e)} backward kernels in {time.time() - t0:.0f} s")
PY
CUFLASH_WARM_CACHE=0 timeout 240 python -m pytest -q -n 14 -p no:cacheprovider -o addopts="-ra --benchmark-disable" \
  tests/test_norm.py -k "backward" 2>&1 | tail -6
timeout 120 python experiments/norm_sweep.py --ops bwd --hiddens 4096,8192,12288,16384,32768 --no-triton \
  --name norm_bwd_vpt 2>&1 | grep -v "it/s" | tail -2
python - <<'PY'
import json
d = json.load(open("experiments/results/norm_bwd_vpt.json"))
for r in d["rows"]:
    if r["impl"] == "cuflash":
        print(r["op"], r["kind"], r["dtype"], r["hidden"], round(r["GBps"]), round(r["frac_copy"], 3),
              r.get("speed_vs_torch") and round(r["speed_vs_torch"], 2), r.get("max_abs_err"))
PY
tar czf "$OUT/r.tgz" experiments/results plots
