#!/usr/bin/env bash
# Probe (scratch, #9): where the Hopper forward's warps stall, per SASS instruction (ncu PC sampling: the
# SourceCounters section), at head_dim 64, 2K causal, bfloat16, the bench shape (B 8, H 32); N, D, CAUSAL (1 / 0)
# in the environment pick another. The report and its source page as CSV land in $OUT (stall.ncu-rep,
# stall_sass.csv). Carry [".kc"].
. experiments/scratch/_call_env.sh
cat > /tmp/stall_p.py <<'PY'
import cupy as cp, cuflash
from cuflash import _dtypes
import os
N, D, causal = int(os.environ.get("N", 2048)), int(os.environ.get("D", 64)), os.environ.get("CAUSAL", "1") == "1"
q, k, v = (cp.random.standard_normal((16384 // N, 2048 // D, N, D), dtype=cp.float32).astype(_dtypes.bfloat16)
           for _ in range(3))
for _ in range(2):
    cuflash.attention(q, k, v, causal=causal)
cp.cuda.runtime.deviceSynchronize()
PY
timeout 150 ncu --kernel-name regex:attention_fwd_sm90 --launch-skip 1 --launch-count 1 --section SourceCounters \
  --section WarpStateStats --import-source no -f -o "$OUT/stall" python /tmp/stall_p.py 2>&1 | tail -3
timeout 60 ncu --import "$OUT/stall.ncu-rep" --page source --csv --print-source sass > "$OUT/stall_sass.csv" \
  2> "$OUT/stall_err.txt"; echo "source page rc=$?"; wc -l "$OUT/stall_sass.csv"; head -c 400 "$OUT/stall_sass.csv"
python experiments/scratch/stall_top.py "$OUT/stall_sass.csv" ${TOP:-12}
