# Device call (#9, QSPLIT): the full GPU suite with the attention bench (the record), then compute-sanitizer
# synccheck / memcheck on persistent launches at head_dim 128 and 64 (tiles Br = 128 ping-pong, 64, 192; work tiles
# of one K/V tile, tails past seqlen_q, windows).
#   CUFLASH_COMMIT=<head> bash experiments/scratch/qsplit_call.sh   (carry [".kc"])
export PATH=/opt/torch/.venv/bin:$PATH
DEADLINE=420 TEST_TIMEOUT=330 BENCH_TIMEOUT=120 BENCH="python experiments/attention_bench.py --rep 20 2>&1 | tail -3" \
  bash experiments/gpu_run.sh h200 -- -n 15 --deselect tests/test_compile.py::test_every_declared_kernel_compiles_without_spills \
  > $OUT/run.log 2>&1
grep -n " passed\| failed\|rc=" $OUT/run.log | head -6
export PYTHONPATH=. CUPY_CACHE_DIR=$PWD/.kcache
for tool in synccheck memcheck; do
  timeout 100 compute-sanitizer --tool $tool python -c "
import cupy as cp, cuflash
from cuflash import _attention_sm90 as S
from cuflash._attn_common import prepare
for d, tile in ((128, (128, 128, 128)), (128, (128, 128, 64)), (64, (128, 128, 64)), (64, (64, 128, 64)), (64, (192, 128, 64))):
    for (b, h, sq, sk, causal, win) in ((8, 16, 512, 100, True, (-1, -1)), (4, 16, 700, 300, False, (60, 0)), (2, 8, 1000, 1000, True, (-1, -1)), (3, 4, 33, 500, False, (-1, -1))):
        q = cp.random.standard_normal((b, h, sq, d), dtype=cp.float32).astype(cuflash.bfloat16)
        k, v = (cp.random.standard_normal((b, h, sk, d), dtype=cp.float32).astype(cuflash.bfloat16) for _ in range(2))
        p = prepare(q, k, v, causal=causal, window_size=win)
        o, l = S.forward(p, tile[:2], pv_n=tile[2], variant='tmap')
cp.cuda.runtime.deviceSynchronize(); print('ok')" 2>&1 | tail -2
done
rm -f $OUT/kc.tgz.* $OUT/junit.xml
