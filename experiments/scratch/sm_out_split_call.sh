# Device call (#3, branch wip/sm-out-split; not yet run): the A/B of the 16-bit softmax output loops copied once
# per output form (softmax_out_split_ab.py, ~60 s), then the softmax tests and the softmax sweep on the split
# kernels (the record, if the A/B shows a gain; otherwise drop the files it leaves).
#   kcache: python experiments/kcache_offline.py /tmp/kc && pack /tmp/kc into .kc/kc.tgz.* (gpu_run.sh's header)
#   CUFLASH_COMMIT=<head> bash experiments/scratch/sm_out_split_call.sh   (carry [".kc"]; ~330 s of device time)
export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=.
timeout 150 python experiments/scratch/softmax_out_split_ab.py > "$OUT"/probe.txt 2>&1
cp experiments/results/softmax_out_split_ab_*.json "$OUT"/ 2>/dev/null
DEADLINE=420 TEST_TIMEOUT=240 BENCH_TIMEOUT=150 BENCH="python experiments/softmax_sweep.py | tail -3" \
  bash experiments/gpu_run.sh h200_sm_split -- tests/test_softmax.py -n 15 > "$OUT"/run.log 2>&1
rm -f "$OUT"/kc.tgz.* "$OUT"/junit.xml
tail -40 "$OUT"/probe.txt; grep h200_sm_split_tests.json "$OUT"/run.log | tail -1; tail -1 "$OUT"/pytest.log
