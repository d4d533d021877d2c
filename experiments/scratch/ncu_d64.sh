#!/usr/bin/env bash
# ncu sections for the head_dim 64 kernels behind the open gaps (#6: wgmma backward at 1K, below torch FLASH;
# #9: Hopper forward at 2K causal, below cuDNN), bfloat16, the bench shapes (16K tokens, hidden 2048), one launch
# each. Output: $OUT/ncu_*.txt.   bash experiments/scratch/ncu_d64.sh   (STALLS=1: stall reasons per issue and
# the SourceCounters section instead)
set -u
export PYTHONPATH=. CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.kcache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$CUPY_CACHE_DIR"
ls .kc/kc.tgz.* >/dev/null 2>&1 && cat .kc/kc.tgz.* | tar xzf - -C "$CUPY_CACHE_DIR"
prog='import sys, cupy as cp, cuflash
n, causal, what = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
b, h, d = 16384 // n, 32, 64
q, k, v, do = (cp.random.standard_normal((b, h, n, d), dtype=cp.float32).astype(cuflash.bfloat16) for _ in range(4))
for _ in range(2):
    o, lse = cuflash.attention(q, k, v, causal=causal, return_lse=True)
    if what == "bwd":
        cuflash.attention_backward(do, q, k, v, o, lse, causal=causal)
cp.cuda.Device().synchronize()'
M="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio --section SourceCounters"
[ "${STALLS:-0}" = 1 ] && S="$M" || S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
run() { timeout 70 ncu $S -k "regex:$1" -s 1 -c 1 python -c "$prog" $2 $3 $4 > "$OUT/ncu_$5.txt" 2>&1; echo "$5 rc=$?"; [ "${STALLS:-0}" = 1 ] && { grep -E "stalled|Warp Stall|^ +[0-9a-f]+ " "$OUT/ncu_$5.txt" | sort -t" " -k3 | head -40; return; }; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Compute \(SM\) Throughput|DRAM Throughput|No Eligible|Warp Cycles Per Issued|Block Limit" "$OUT/ncu_$5.txt" | head -14; }
run bwd_dkdv_sm90 1024 0 bwd bwd_1k
run bwd_dkdv_sm90 1024 1 bwd bwd_1k_causal
run attention_fwd_sm90_ws 2048 1 fwd fwd_2k_causal
