"""Probe (#4, scratch): where plain LayerNorm with weight and bias (of x's dtype) should take the cluster path once
both the cluster kernel's (20b5a00) and the register kernel's (b5a5b41) output loops are specialised for it:
norm.FWD_CLUSTER_LAYER_AFFINE 0 (never: norm_fwd / norm_fwd_stream), 2 and 4, at bfloat16 16K-32K and float32
8K-16K, rows of mean 1 and std 2. Interleaved, three rounds, copy in the same run; max abs error of y against
float64 on 256 rows. (Its loop is _ln_plan_ab.run since 2026-12-01.)
    PYTHONPATH=. python experiments/scratch/ln_affine_plan_ab.py       (device)"""
import sys

sys.path.insert(0, "experiments/scratch")
from _ln_plan_ab import run  # noqa: E402

V = {f"aff{n}": dict(FWD_CLUSTER_LAYER_AFFINE=n) for n in (0, 2, 4)}
run("ln_affine_plan_ab", V, [("bfloat16", 16384), ("bfloat16", 32768), ("float32", 8192), ("float32", 16384)],
    loc=1.0, scale=2.0)
