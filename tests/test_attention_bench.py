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
