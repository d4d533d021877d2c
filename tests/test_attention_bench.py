"""pytest-benchmark runs of the attention forward (GPU; skipped without one, and with --benchmark-disable they
run once as smoke tests). FlashAttention-2 convention: 16K tokens, hidden 2048. Peers: torch SDPA FLASH backend.

    pytest tests/test_attention_bench.py --benchmark-only
"""
import numpy as np
import pytest

from cuflash import _dtypes

pytestmark = pytest.mark.gpu


def _sync_call(fn):
    import cupy as cp

    def run():
        out = fn()
        cp.cuda.get_current_stream().synchronize()
        return out

    return run


def _inputs(cp, seqlen, head_dim, dtype):
    rng = cp.random.default_rng(0)
    shape = (16384 // seqlen, 2048 // head_dim, seqlen, head_dim)
    return [rng.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bench_cuflash_fa2(benchmark, cp, head_dim, causal):
    from cuflash.attention import attention, flops

    q, k, v = _inputs(cp, 4096, head_dim, _dtypes.bfloat16)
    run = _sync_call(lambda: attention(q, k, v, causal=causal))
    run()
    benchmark.extra_info["flops"] = flops(*q.shape[:3], 4096, head_dim, causal)
    benchmark.pedantic(run, rounds=20, iterations=1, warmup_rounds=2)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bench_torch_flash(benchmark, cp, head_dim, causal):
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cuflash.attention import flops

    q, k, v = (torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
               for x in _inputs(cp, 4096, head_dim, _dtypes.bfloat16))

    def fn():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
        return out

    fn()
    benchmark.extra_info["flops"] = flops(q.shape[0], q.shape[1], 4096, 4096, head_dim, causal)
    benchmark.pedantic(fn, rounds=20, iterations=1, warmup_rounds=2)


def test_time_rotated_orders_and_counts(cp):
    """bench.time_rotated: every contender timed once a round (one warm-up call and ``rep`` timed ones), in
    rotated and reversed orders (three contenders, six rounds: each of the six orders once)."""
    from cuflash import bench

    x = cp.asarray(np.random.default_rng().standard_normal(1 << 20, dtype=np.float32))
    calls = []
    fns = {n: (lambda n=n: (calls.append(n), x * 2)) for n in "abc"}
    t = bench.time_rotated(fns, rounds=6, warmup=1, rep=3)
    assert set(t) == set("abc")
    assert all(len(v["rounds_ms"]) == 6 and v["n"] == 18 and v["median_ms"] > 0 for v in t.values())
    assert calls[:3] == list("abc")
    blocks = calls[3:]
    assert len(blocks) == 6 * 3 * 4 and all(len(set(blocks[i:i + 4])) == 1 for i in range(0, len(blocks), 4))
    orders = ["".join(blocks[i + 4 * j] for j in range(3)) for i in range(0, len(blocks), 12)]
    assert orders == ["abc", "cba", "bca", "acb", "cab", "bac"]
