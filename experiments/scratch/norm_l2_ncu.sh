#!/usr/bin/env bash
# Probe (#4, scratch): is plain LayerNorm with weight and bias bound by L2 -> SM reads where its weights are re-read
# per row? Nsight Compute metrics (clocks not locked) of one forward launch after two warm-ups, ~256 MiB of x, for
# the paths of the rows below 0.9 of copy and for rows above it. Output: $OUT/norm_l2_ncu.txt. Carry [".kc"].
. experiments/scratch/_call_env.sh
prog='import sys, cupy as cp
from cuflash import _dtypes, norm as nm
kind, dname, n, aff = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dt = getattr(_dtypes, dname)
x = cp.random.standard_normal(((256 << 20) // (n * dt.itemsize), n), dtype=cp.float32).astype(dt)
w, b = ((1 + 0.1 * cp.random.standard_normal(n, dtype=cp.float32)).astype(dt) if aff else None for _ in range(2))
for _ in range(3):
    y = nm.layer_norm(x, (n,), w, b) if kind == "ln" else nm.rms_norm(x, (n,), w)
cp.cuda.Device().synchronize()'
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
M=$M,l1tex__t_sector_hit_rate.pct,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,launch__shared_mem_config_size,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers
M=$M,launch__occupancy_limit_shared_mem,lts__t_sector_hit_rate.pct
for c in "ln bfloat16 16384 1" "ln bfloat16 16384 0" "rms bfloat16 16384 1" "ln bfloat16 8192 1" "ln bfloat16 32768 1" \
         "rms bfloat16 32768 1" "ln float32 16384 1" "ln float32 32768 1" "ln float32 8192 1"; do
  echo "== $c"
  timeout 90 ncu --clock-control none --metrics $M -k regex:norm_fwd -s 2 -c 1 python -c "$prog" $c 2>&1 \
    | grep -E "norm_fwd|  [a-z_]+__" | sed 's/(const T1.*//' | cut -c1-110
done
