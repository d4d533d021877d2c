#!/usr/bin/env bash
# Probe (#4, scratch): norm_fwd_stream (plain LayerNorm bf16 32K, float32 16K) read 2x x's sectors from L2 by
# cp.async.cg (norm_l2_ncu.sh: 16.9M against 8.39M; the other norm kernels read x once). Same metrics with
# STREAM_STAGES 2 and 3 (clocks not locked, one launch after two warm-ups), then each timed twice (CUDA events).
# CASES="dtype hidden stages;..." replaces the four cases; TIME=0 skips the timings (ln_issue_call.sh).
. experiments/scratch/_call_env.sh
prog='import sys, cupy as cp
from cuflash import _dtypes, bench, norm as nm
dname, n, st = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
nm.STREAM_STAGES = st
dt = getattr(_dtypes, dname)
x = cp.random.standard_normal(((256 << 20) // (n * dt.itemsize), n), dtype=cp.float32).astype(dt)
w, b = ((1 + 0.1 * cp.random.standard_normal(n, dtype=cp.float32)).astype(dt) for _ in range(2))
for _ in range(3):
    y = nm.layer_norm(x, (n,), w, b)
cp.cuda.Device().synchronize()
if len(sys.argv) > 4:
    print(dname, n, "stages", st, "%.1f us" % (1e3 * bench.time_cuda(lambda: nm.layer_norm(x, (n,), w, b), rep=50)["median_ms"]))'
M=gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
M=$M,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum
M=$M,smsp__inst_executed_op_ldgsts.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,launch__shared_mem_config_size
M=$M,l1tex__m_xbar2l1tex_read_sectors.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
IFS=';' read -r -a cases <<< "${CASES:-bfloat16 32768 3;bfloat16 32768 2;float32 16384 3;float32 16384 2}"
for c in "${cases[@]}"; do
  echo "== $c"
  timeout 90 ncu --clock-control none --metrics $M -k regex:norm_fwd -s 2 -c 1 python -c "$prog" $c 2>&1 \
    | grep -E "norm_fwd|  [a-z_]+__" | sed 's/(const T1.*//' | cut -c1-110
done
[ "${TIME:-1}" = 1 ] && for r in 1 2; do for c in "${cases[@]}"; do python -c "$prog" $c t; done; done
