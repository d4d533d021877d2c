#!/usr/bin/env bash
# Probe (scratch, #3 / #4): ncu on the memory-bound kernels below the 0.9-of-copy line, one launch each after a
# warm-up, bench shapes (~256 MiB in): LayerNorm bf16 32K with weight and bias (norm_fwd_stream), softmax bf16 32K
# (softmax_cluster C = 1) and float32 32K (C = 2). Sections as ncu_d64.sh, then the stall reasons per SASS
# instruction (stall_top.py). Output: $OUT/ncu_<name>.txt, $OUT/stall_<name>.csv. Carry [".kc"].
. experiments/scratch/_call_env.sh
prog='import sys, cupy as cp, cuflash
what, dt, n = sys.argv[1], getattr(cuflash, sys.argv[2], None) or cp.dtype(sys.argv[2]), int(sys.argv[3])
rows = (256 << 20) // (n * cp.dtype(dt).itemsize)
x = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dt)
w, b = (cp.random.standard_normal(n, dtype=cp.float32).astype(dt) for _ in range(2))
for _ in range(2):
    y = (cuflash.layer_norm(x, (n,), w, b) if what == "ln" else cuflash.log_softmax(x, axis=-1) if what == "lsm"
         else cuflash.softmax(x, axis=-1))
cp.cuda.Device().synchronize()'
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters ${EXTRA_SECTIONS:-}"
run() {  # kernel-regex what dtype n name
  timeout 90 ncu $S -k "regex:$1" -s 1 -c 1 --import-source no -f -o "$OUT/$5" python -c "$prog" $2 $3 $4 > /dev/null 2>&1
  echo "== $5 rc=$?"
  ncu --import "$OUT/$5.ncu-rep" > "$OUT/ncu_$5.txt" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Compute \(SM\) Throughput|DRAM Throughput|No Eligible|Warp Cycles Per Issued|Block Limit|Executed Ipc A|L2 Cache Throughput|Shared Memory Configuration Size|Dynamic Shared|Pipe|XU|FMA|ALU" "$OUT/ncu_$5.txt" | head -${GREP_LINES:-20}
  ncu --import "$OUT/$5.ncu-rep" --page source --csv --print-source sass > "$OUT/stall_$5.csv" 2>/dev/null
  python experiments/scratch/stall_top.py "$OUT/stall_$5.csv" 14 2>&1 | cut -c1-150
  rm -f "$OUT/$5.ncu-rep"; gzip -f "$OUT/stall_$5.csv"
}
# what: ln (layer_norm), lsm (log_softmax) or sm (softmax); EXTRA_SECTIONS: more ncu sections (e.g.
# "--section ComputeWorkloadAnalysis --section InstructionStats": pipe utilisation).
# with arguments: those runs instead, five words each (kernel-regex what dtype n name), e.g. the 16-bit cluster
# rows (#3): bash experiments/scratch/ncu_mem.sh softmax_cluster sm bfloat16 65536 sm_bf16_64k softmax_cluster sm \
#   float32 32768 sm_f32_32k
if [ $# -gt 0 ]; then
  while [ $# -ge 5 ]; do run "$1" "$2" "$3" "$4" "$5"; shift 5; done
  exit 0
fi
run norm_fwd_stream ln bfloat16 32768 ln_bf16_32k
run softmax_cluster sm bfloat16 32768 sm_bf16_32k
run softmax_cluster sm float32 32768 sm_f32_32k
