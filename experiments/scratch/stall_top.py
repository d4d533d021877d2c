"""Summary of an ncu source-page CSV (experiments/scratch/stall_src.sh): warp-stall samples by reason, and the
instructions with the most samples (index, samples, share, times executed, SASS, the reasons >= 15 % of them).
    python experiments/scratch/stall_top.py stall_sass.csv[.gz] [N 30]"""
import csv
import gzip
import io
import sys

path, n = sys.argv[1], int((sys.argv[2:] or [30])[0])
text = (gzip.open(path, "rt") if path.endswith(".gz") else open(path)).read()
rows = list(csv.reader(io.StringIO(text)))
hdr, data = rows[1], rows[2:]
ix = {h: i for i, h in enumerate(hdr)}


def val(r, k):
    try:
        return float(r[ix[k]])
    except ValueError:
        return 0.0


ALL, EXE = "Warp Stall Sampling (All Samples)", "Instructions Executed"
tot = sum(val(r, ALL) for r in data)
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
print(f"{len(data)} SASS instructions, {tot:.0f} samples, {sum(val(r, EXE) for r in data):.4g} warp instructions")
for k, v in sorted(((k, sum(val(r, k) for r in data)) for k in reasons), key=lambda x: -x[1])[:10]:
    print(f"  {k[6:]:16s} {v:8.0f}  {v / tot:.3f}")
for i, r in sorted(enumerate(data), key=lambda x: -val(x[1], ALL))[:n]:
    s = val(r, ALL)
    why = {k[6:]: int(val(r, k)) for k in reasons if val(r, k) >= 0.15 * s}
    print(f"{i:5d} {s:6.0f} {s / tot:.3f} {val(r, EXE):10.0f}  {r[ix['Source']].strip()[:56]:56s} {why}")
