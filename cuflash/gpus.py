"""GPU specification tables: the one place the roofline and the predicted-mode sweeps read ceilings from.

Values are the vendors' datasheet numbers (dense, i.e. without structured sparsity) for the SXM parts, plus,
for the H200, the copy bandwidth and bf16 matmul throughput *measured* on the project's H200
(``/work/shared/anchors/h200-2026-11-29.json``: device-to-device copy 4108 GB/s counted as bytes read + written,
bf16 matmul 8192^3 752 TFLOP/s). Sources: NVIDIA A100 datasheet (2020), H100 datasheet (2022/23),
H200 product brief (2024); L2 and shared memory from the CUDA programming guide's compute-capability tables
(and, for the H200, the device properties the anchor run read).

Every predicted number made from these tables is labelled ``predicted`` (see :func:`predict_time_s`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class GPU:
    name: str
    hbm_GBps: float              # datasheet peak HBM bandwidth, GB/s (1e9 B/s)
    bf16_TFLOPs: float           # dense tensor-core bf16 (= fp16) TFLOP/s
    fp16_TFLOPs: float           # dense tensor-core fp16 TFLOP/s
    tf32_TFLOPs: float           # dense tensor-core tf32 TFLOP/s
    fp32_TFLOPs: float           # SIMT (non-tensor) fp32 TFLOP/s
    sms: int
    l2_bytes: int
    smem_per_sm: int             # bytes of shared memory per SM
    smem_optin_per_block: int    # bytes a block may opt in to
    measured_copy_GBps: float | None = None   # read + written bytes / s of a large D2D copy, measured
    measured_matmul_TFLOPs: float | None = None  # bf16 matmul, measured
    notes: str = ""
    aliases: tuple = field(default=())
    cc: int | None = None        # compute capability as an int (80, 90): which kernel paths a plan may take

    def copy_GBps(self) -> float:
        """The bandwidth ceiling to use: measured when known, else the datasheet peak."""
        return self.measured_copy_GBps or self.hbm_GBps

    def matmul_TFLOPs(self, dtype="bfloat16", tensor_cores: bool = True) -> float:
        """The compute ceiling for ``dtype``: tensor cores for 16-bit inputs (measured bf16 when known);
        SIMT fp32 for float32 (or ``tensor_cores=False``)."""
        name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
        if not tensor_cores or name in ("float32", "float64"):
            return self.fp32_TFLOPs
        if self.measured_matmul_TFLOPs:
            return self.measured_matmul_TFLOPs
        return self.fp16_TFLOPs if name == "float16" else self.bf16_TFLOPs


GPUS: dict[str, GPU] = {
    "A100": GPU("A100", hbm_GBps=2039.0, bf16_TFLOPs=312.0, fp16_TFLOPs=312.0, tf32_TFLOPs=156.0,
                fp32_TFLOPs=19.5, sms=108, l2_bytes=40 * MIB, smem_per_sm=164 * KIB,
                smem_optin_per_block=163 * KIB, notes="A100 SXM4 80GB datasheet",
                aliases=("A100-SXM4-80GB", "NVIDIA A100"), cc=80),
    "H100": GPU("H100", hbm_GBps=3350.0, bf16_TFLOPs=989.4, fp16_TFLOPs=989.4, tf32_TFLOPs=494.7,
                fp32_TFLOPs=66.9, sms=132, l2_bytes=50 * MIB, smem_per_sm=228 * KIB,
                smem_optin_per_block=227 * KIB, notes="H100 SXM5 80GB datasheet",
                aliases=("H100 SXM", "NVIDIA H100", "NVIDIA H100 80GB HBM3"), cc=90),
    "H200": GPU("H200", hbm_GBps=4800.0, bf16_TFLOPs=989.4, fp16_TFLOPs=989.4, tf32_TFLOPs=494.7,
                fp32_TFLOPs=66.9, sms=132, l2_bytes=60 * MIB, smem_per_sm=228 * KIB,
                smem_optin_per_block=227 * KIB, measured_copy_GBps=4108.0, measured_matmul_TFLOPs=752.0,
                notes="H200 SXM 141GB product brief; copy 4108 GB/s and bf16 matmul 752 TFLOP/s measured "
                      "(anchors/h200-2026-11-29.json)",
                aliases=("NVIDIA H200",), cc=90),
}

DEFAULT = "H200"


def get(name: str | None = None) -> GPU:
    """The table entry for ``name`` ("H200", "H100", "A100", or a device name such as "NVIDIA H200");
    ValueError for an unknown GPU."""
    if name is None:
        name = DEFAULT
    key = str(name).strip()
    if key in GPUS:
        return GPUS[key]
    up = key.upper()
    for g in GPUS.values():
        if up == g.name.upper() or any(up == a.upper() for a in g.aliases) or g.name in up.split():
            return g
    for g in GPUS.values():
        if g.name in up:
            return g
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")


def predict_time_s(bytes_moved: float, flops: float, gpu: str | GPU = DEFAULT, dtype="bfloat16",
                   tensor_cores: bool = True) -> float:
    """Roofline-predicted time in seconds: max(bytes / copy bandwidth, flops / compute ceiling).

    The bandwidth is the measured copy bandwidth where the table has one (H200), else the datasheet peak;
    the compute ceiling is :meth:`GPU.matmul_TFLOPs`. A lower bound on the real time (no latency, no launch
    overhead, no imperfect overlap).
    """
    g = gpu if isinstance(gpu, GPU) else get(gpu)
    t_mem = float(bytes_moved) / (g.copy_GBps() * 1e9)
    t_cmp = float(flops) / (g.matmul_TFLOPs(dtype, tensor_cores) * 1e12) if flops else 0.0
    return max(t_mem, t_cmp)
