"""cuflash: IO-aware GPU kernels (online softmax, LayerNorm/RMSNorm, FlashAttention) for research.

CUDA C sources in ``cuda_src/`` are JIT-compiled with NVRTC through ``cupy.RawModule``; the functions below take
and return CuPy arrays. This module only re-exports the public API.
"""
from ._compile import ConfigurationError
from ._dtypes import bfloat16
from .softmax import softmax, log_softmax, logsumexp, online_softmax_state, merge_states, lse_from_state
from .norm import layer_norm, rms_norm, layer_norm_backward, rms_norm_backward
from .attention import attention
from .attention_bwd import attention_backward
from . import amp, reference, traffic, bench

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError", "bfloat16",
    "softmax", "log_softmax", "logsumexp", "online_softmax_state", "merge_states", "lse_from_state",
    "layer_norm", "rms_norm", "layer_norm_backward", "rms_norm_backward",
    "attention", "attention_backward", "amp", "reference", "traffic", "bench",
]
