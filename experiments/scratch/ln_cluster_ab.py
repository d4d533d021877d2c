"""Probe (#4, scratch): plain LayerNorm (weight and bias) on the cluster path (norm.FWD_CLUSTER_PLAIN_LAYER, and
with its weights held in shared memory, FWD_CLUSTER_HOLD) against the default plan, bfloat16 16K-32K and float32
8K-32K, same run, three interleaved rounds, copy in the same run, max abs error of y against float64 on 256 rows.
Rows of mean 0, std 1. (Its loop is _ln_plan_ab.run since 2026-12-01; the label "h" marks a plan with dynamic
shared memory, held or, since 931841a, staged.)
    PYTHONPATH=. python experiments/scratch/ln_cluster_ab.py       (device)"""
import sys

sys.path.insert(0, "experiments/scratch")
from _ln_plan_ab import run  # noqa: E402

V = {"default": dict(FWD_CLUSTER_PLAIN_LAYER=False, FWD_CLUSTER_HOLD=False),
     "cluster": dict(FWD_CLUSTER_PLAIN_LAYER=True, FWD_CLUSTER_HOLD=False),
     "cluster_hold": dict(FWD_CLUSTER_PLAIN_LAYER=True, FWD_CLUSTER_HOLD=True)}
run("ln_cluster_ab", V, [("bfloat16", 16384), ("bfloat16", 32768), ("float32", 8192), ("float32", 16384),
                         ("float32", 32768)])
