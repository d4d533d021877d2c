"""cuflash attention as a ``torch.autograd.Function``: forward and backward through DLPack, no copies.

The forward saves ``out`` and the float32 ``lse``; the backward recomputes P from them
(``cuflash.attention_backward``). Tensors cross between torch and CuPy as DLPack views of the same memory
(bfloat16 through a 16-bit integer view, which every DLPack version carries); the kernels run on torch's current
stream through ``cupy.cuda.ExternalStream``. The script checks the gradients against torch SDPA's math backend
(float64) and prints the errors.

    python experiments/torch_autograd_example.py [--causal] [--dtype bfloat16|float16|float32]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    import cupy
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"torch_autograd_example: needs cupy and torch ({e})")
    sys.exit(2)

# --8<-- README snippet ------------------------------------------------------------------------------------------

import cuflash  # noqa: E402


def to_cupy(t):
    """Zero-copy CuPy view of a torch CUDA tensor (any strides)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16).view(cuflash.bfloat16)
    return cupy.from_dlpack(t)


def to_torch(a):
    """Zero-copy torch view of a CuPy array."""
    if a.dtype == cuflash.bfloat16:
        return torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


class FlashAttention(torch.autograd.Function):
    """q: (batch, heads_q, seqlen_q, d), k, v: (batch, heads_kv, seqlen_k, d); float16 / bfloat16 / float32."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1)):
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            out, lse = cuflash.attention(to_cupy(q), to_cupy(k), to_cupy(v), causal=causal,
                                         softmax_scale=softmax_scale, window_size=window_size, return_lse=True)
        out, lse = to_torch(out), to_torch(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, softmax_scale, window_size)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        causal, softmax_scale, window_size = ctx.args
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            dq, dk, dv = cuflash.attention_backward(
                to_cupy(dout), to_cupy(q), to_cupy(k), to_cupy(v), to_cupy(out), to_cupy(lse), causal=causal,
                softmax_scale=softmax_scale, window_size=window_size)
        return to_torch(dq), to_torch(dk), to_torch(dv), None, None, None


def flash_attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1)):
    return FlashAttention.apply(q, k, v, causal, softmax_scale, window_size)
# --8<-- end of README snippet ---------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--shape", type=int, nargs=5, default=[2, 8, 2, 1000, 128],
                    metavar=("BATCH", "HEADS_Q", "HEADS_KV", "SEQLEN", "HEAD_DIM"))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("torch_autograd_example: no CUDA device (run on the GPU machine)")
        return 2
    B, Hq, Hkv, S, D = a.shape
    dt = getattr(torch, a.dtype)
    torch.manual_seed(0)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(B, Hq, S, D, device="cuda", dtype=dt)
    (flash_attention(q, k, v, causal=a.causal) * w).sum().backward()
    ours = [t.grad.double() for t in (q, k, v)]

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    g = Hq // Hkv
    o = torch.nn.functional.scaled_dot_product_attention(
        q64, k64.repeat_interleave(g, 1), v64.repeat_interleave(g, 1), is_causal=a.causal)
    (o * w.double()).sum().backward()
    ok = True
    for name, mine, ref in zip(("dq", "dk", "dv"), ours, (q64.grad, k64.grad, v64.grad)):
        err = (mine - ref).abs().max().item()
        rel = err / ref.abs().max().item()
        print(f"{name}: max abs err {err:.3e} (relative to max |grad| {rel:.2e})")
        ok = ok and rel < 0.05
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
