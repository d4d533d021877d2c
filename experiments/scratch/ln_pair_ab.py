"""Probe (#4, scratch): plain LayerNorm rows of 1024-4095 vectors (bf16 8K-16K, float32 4K-8K) on norm_fwd_stream
with two 512-thread blocks an SM (norm.STREAM_PAIR_VECS) or one (STREAM_MIN_VECS 1024) against their default path
(norm_fwd, the row in registers); three interleaved rounds in one process, copy in the same run (_ln_plan_ab.run).
    PYTHONPATH=. python experiments/scratch/ln_pair_ab.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ln_plan_ab import run  # noqa: E402

run("ln_pair_ab", {"default": {"STREAM_PAIR_VECS": 0, "STREAM_MIN_VECS": 4096},
                  "pair": {"STREAM_PAIR_VECS": 1024, "STREAM_MIN_VECS": 4096},
                  "stream1": {"STREAM_PAIR_VECS": 0, "STREAM_MIN_VECS": 1024}},
    [("bfloat16", 8192), ("bfloat16", 16384), ("float16", 16384), ("float32", 4096), ("float32", 8192)])
