#!/usr/bin/env bash
# Probe (scratch, #3): ncu on softmax_cluster, main's tree (abm/, cp.async a slot a thread) against this one (bulk
# copies), float32 64K columns (C = 4: bulk -6 %) and 128K (C = 8: bulk +6 %), one launch each after a warm-up,
# ~256 MiB in, clocks left alone. Output: $OUT/ncu_bulk_<tree>_<cols>.txt. Carry [".kc", "abm"].
. experiments/scratch/_call_env.sh
prog='import sys, cupy as cp, cuflash
n = int(sys.argv[1]); rows = (256 << 20) // (n * 4)
x = cp.random.standard_normal((rows, n), dtype=cp.float32)
for _ in range(3):
    y = cuflash.softmax(x, axis=-1)
cp.cuda.Device().synchronize()'
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
for n in 65536 131072; do
  for tree in abm .; do
    name=ncu_bulk_$([ "$tree" = abm ] && echo tree || echo here)_$n
    PYTHONPATH=$tree timeout 100 ncu --clock-control none $S -k "regex:softmax_cluster" -s 2 -c 1 python -c "$prog" $n \
      > "$OUT/$name.txt" 2>&1
    echo "== $name rc=$?"
    grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|DRAM Throughput|No Eligible|Warp Cycles Per Issued|Block Limit|Executed Ipc A|Cluster|Waves Per SM|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/$name.txt" | head -30
  done
done
