"""Probe (#4, scratch): the streamed forward's (norm_fwd_stream) own output loop for plain LayerNorm with weight
and bias (CUFLASH_SSPLIT=1, as norm_fwd's since f788cba) with its per-row-weights loop unrolled once
(CUFLASH_SUNROLL=1: at 2 or 4 the split kernels spill 12-28 bytes), against the one loop at unroll 4 (as at
b838f6c) and the one loop at unroll 1; at the rows that take the streamed kernel (plain LayerNorm bfloat16 32K and
64K, float32 16K and 64K) and an RMSNorm row on it (bfloat16 64K, the general loop). Interleaved, three rounds,
copy in the same run; each variant's kernel checked by its options; max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/norm_stream_split_ab.py       (device)"""
import sys

sys.path.insert(0, "experiments/scratch")
from _norm_opt_ab import run  # noqa: E402

VARIANTS = {"split": ("-DCUFLASH_SSPLIT=1", "-DCUFLASH_SUNROLL=1"),
            "old": ("-DCUFLASH_SSPLIT=0", "-DCUFLASH_SUNROLL=4"),
            "old_u1": ("-DCUFLASH_SSPLIT=0", "-DCUFLASH_SUNROLL=1")}
# (kind, dtype, hidden, residual, affine, forced onto the cluster path)
CASES = [("layer", d, h, False, True, False) for d, h in [("bfloat16", 32768), ("float32", 16384), ("bfloat16", 65536),
                                                           ("float32", 65536)]]
CASES += [("rms", "bfloat16", 65536, False, True, False)]
run("norm_stream_split_ab", VARIANTS, CASES, lambda pl: bool(pl.stream), ref="old")
