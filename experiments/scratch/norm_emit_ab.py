"""Probe (#4, scratch): norm_fwd_cluster's output loop specialised per presence of weight and bias
(CUFLASH_EMIT_SPLIT=1) against w and b tested per vector (0, as at 009c85a). Plain LayerNorm with weight and bias
forced onto the cluster path (FWD_CLUSTER_PLAIN_LAYER) and by default, LayerNorm without them, fused-residual
LayerNorm and RMSNorm; interleaved, three rounds, copy in the same run; each variant's kernel checked by its
options; max abs error of y against float64 on 256 rows.
    PYTHONPATH=. python experiments/scratch/norm_emit_ab.py       (device)"""
import sys

sys.path.insert(0, "experiments/scratch")
from _norm_opt_ab import run  # noqa: E402

VARIANTS = {"split": ("-DCUFLASH_EMIT_SPLIT=1",), "old": ("-DCUFLASH_EMIT_SPLIT=0",)}
# (kind, dtype, hidden, residual, affine, forced onto the cluster path)
CASES = [("layer", d, h, False, True, True) for d, h in [("bfloat16", 16384), ("bfloat16", 32768),
                                                          ("float32", 8192), ("float32", 16384)]]
CASES += [("layer", "bfloat16", 16384, False, False, False), ("layer", "float32", 16384, False, False, False)]
CASES += [("layer", "bfloat16", 32768, True, True, False), ("layer", "float32", 16384, True, True, False)]
CASES += [("rms", "bfloat16", 32768, False, True, False), ("rms", "float32", 16384, False, True, False),
          ("rms", "bfloat16", 16384, True, True, False)]
run("norm_emit_ab", VARIANTS, CASES, lambda pl: bool(pl.cluster), ref="old")
