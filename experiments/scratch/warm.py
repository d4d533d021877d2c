"""Compile the declared kernels of the named sources into CuPy's cache, in parallel (scratch helper).
    python experiments/scratch/warm.py [SOURCE ...] [--match SUBSTR,SUBSTR]   (--match: names containing one)"""
import json, subprocess, sys, time
sys.path.insert(0, ".")
from cuflash import _compile
W = ("import json,sys\nfrom cuflash import _compile\n"
     "for s,n,o in json.load(sys.stdin): _compile.get_kernel(s,n,tuple(o))")
args = sys.argv[1:]
match = args[args.index("--match") + 1].split(",") if "--match" in args else None
srcs = {a for i, a in enumerate(args) if a != "--match" and (i == 0 or args[i - 1] != "--match")}
e = [(s, n, list(o)) for (s, n, o, _r) in _compile.declared()
     if (not srcs or s in srcs) and (match is None or any(m in n for m in match))]
t0 = time.time()
chunks = [c for c in (e[i::15] for i in range(15)) if c]
ps = [subprocess.Popen([sys.executable, "-c", W], stdin=subprocess.PIPE, text=True) for _ in chunks]
for p, c in zip(ps, chunks):
    p.communicate(json.dumps(c))
print(f"warm: {len(e)} kernels of {sorted(srcs) or 'all'}{' matching ' + ','.join(match) if match else ''} in "
      f"{time.time() - t0:.0f} s")
