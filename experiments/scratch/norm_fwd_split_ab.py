"""Probe (#4, scratch): the register forward's (norm_fwd) own output loop for plain LayerNorm with weight and bias
(CUFLASH_FWD_SPLIT=1) against the one loop testing w and b per element (0, as at 6c18047), at the rows that take
norm_fwd (plain LayerNorm bfloat16 1K-8K, float32 1K-4K), and rows of the general loop (weight only, RMSNorm,
fused residual) for regressions; interleaved, three rounds, copy in the same run; each variant's kernel checked
by its options; max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/norm_fwd_split_ab.py       (device)"""
import sys

sys.path.insert(0, "experiments/scratch")
from _norm_opt_ab import run  # noqa: E402

VARIANTS = {"split": ("-DCUFLASH_FWD_SPLIT=1",), "old": ("-DCUFLASH_FWD_SPLIT=0",)}
# (kind, dtype, hidden, residual, affine, forced onto the cluster path)
CASES = [("layer", d, h, False, True, False) for d, h in [("bfloat16", 1024), ("bfloat16", 2048), ("bfloat16", 4096),
                                                           ("bfloat16", 8192), ("float32", 1024), ("float32", 2048),
                                                           ("float32", 4096)]]
CASES += [("rms", "bfloat16", 4096, False, True, False), ("layer", "bfloat16", 4096, True, True, False),
          ("layer", "float32", 1024, True, True, False)]
run("norm_fwd_split_ab", VARIANTS, CASES, lambda pl: not pl.cluster and not pl.stream, ref="old")
