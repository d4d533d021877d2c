#!/usr/bin/env bash
# Device call (#4): Nsight Compute L2 read sectors of norm_fwd_stream here (its copy variant), then the
# same-run A/B against main's tree (abm/, MATCH=norm_fwd experiments/scratch/ab_tree.sh), ROUNDS interleaved;
# carry ["abm", ".kc"].
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
prog='import sys, cupy as cp
from cuflash import _dtypes, norm as nm
dname, n, st = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
nm.STREAM_STAGES = st
dt = getattr(_dtypes, dname)
x = cp.random.standard_normal(((256 << 20) // (n * dt.itemsize), n), dtype=cp.float32).astype(dt)
w, b = ((1 + 0.1 * cp.random.standard_normal(n, dtype=cp.float32)).astype(dt) for _ in range(2))
for _ in range(3):
    y = nm.layer_norm(x, (n,), w, b)
cp.cuda.Device().synchronize()'
M=gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed_op_ldgsts.sum
for c in "bfloat16 32768 2" "float32 16384 2"; do
  echo "== ncu here $c"
  timeout 60 ncu --clock-control none --metrics $M -k regex:norm_fwd -s 2 -c 1 python -c "$prog" $c 2>&1 \
    | grep -E "  [a-z_]+__" | cut -c1-100
done
for r in $(seq "${ROUNDS:-3}"); do
  echo "== tree round $r"
  PYTHONPATH=$PWD/abm timeout 100 python experiments/scratch/ln_issue_ab.py ln_issue_tree_$r
  cp abm/experiments/results/ln_issue_tree_$r.* experiments/results/ 2>/dev/null
  echo "== here round $r"
  timeout 100 python experiments/scratch/ln_issue_ab.py ln_issue_here_$r
  pack
done
