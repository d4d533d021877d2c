#!/usr/bin/env bash
# Probe (#3, scratch): the softmax rows below 0.9 of copy (1-4 MiB: C = 16 clusters, the held split) against a row
# above it (C = 8): Nsight Compute metrics (clocks not locked, one launch after two warm-ups, ~256 MiB of x), as
# norm_l2_ncu.sh: L2 sectors read for x's 8.39M, DRAM and L2 throughput, issue activity. Carry [".kc"]. Written
# 2026-12-01 after that day's device time was spent: not yet run.
. experiments/scratch/_call_env.sh
prog='import sys, cupy as cp
from cuflash import _dtypes, softmax
dt = getattr(_dtypes, sys.argv[1]); n = int(sys.argv[2])
x = cp.random.standard_normal(((256 << 20) // (n * dt.itemsize), n), dtype=cp.float32).astype(dt)
for _ in range(3):
    y = softmax(x, axis=-1)
cp.cuda.Device().synchronize()'
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum
M=$M,lts__t_sectors_srcunit_tex_op_write.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__shared_mem_config_size
for c in "float32 131072" "float32 262144" "float32 1048576" "bfloat16 524288"; do
  echo "== $c"
  timeout 60 ncu --clock-control none --metrics $M -k regex:softmax -s 2 -c 1 python -c "$prog" $c 2>&1 \
    | grep -E "softmax_|  [a-z_]+__" | sed 's/(const T1.*//' | cut -c1-100
done
