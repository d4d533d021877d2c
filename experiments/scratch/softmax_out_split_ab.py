"""Probe (#3, scratch; run at d8618b0, logs/softmax_out_split_ab_d8618b0.json; main then dropped the study macro
CUFLASH_SM_SPLIT and kept the split, SASS-identical: check out d8618b0 to run it again): the 16-bit softmax output loops copied once per
output form (with_output_const: the fast exp2 softmax, softmax, log_softmax as compile-time cases, so
output_slot's per-slot tests fold away; CUFLASH_SM_SPLIT=1) against the one loop testing them per slot (0, as on
main), as norm.cu's output loops with the weight and bias known present gained 3-14 % (20b5a00, f788cba,
0abf0e2). Softmax and log_softmax, bfloat16 and float16 4K-1M columns (cached, cluster, held paths) and float32
rows for regressions (their kernels changed registers by a lambda, not by the split), at 256 MiB; interleaved,
three rounds, copy in the same run; each variant's kernels checked by their options; max abs error against
float64 on 64 rows.
    PYTHONPATH=. python experiments/scratch/softmax_out_split_ab.py       (device)"""
import os

import cupy as cp

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm
from cuflash import _compile

VARIANTS = {"split": ("-DCUFLASH_SM_SPLIT=1",), "old": ("-DCUFLASH_SM_SPLIT=0",)}
get_kernel = _compile.get_kernel


def use(variant):
    opt = VARIANTS[variant]
    _compile.get_kernel = lambda src, name, extra=(): get_kernel(src, name, tuple(extra) + opt)
    sm._PREP.clear()


SHAPES = [(d, c) for d in ("bfloat16", "float16") for c in (4096, 16384, 32768, 65536, 262144, 524288, 1048576)]
SHAPES += [("float32", c) for c in (4096, 32768, 262144)]
out = []
copy = copy_bandwidth()
for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    sel = cp.linspace(0, rows - 1, 64).astype(cp.int64)
    x64 = x[sel].astype(cp.float64)
    ref = {sm.OP_SOFTMAX: cp.exp(x64 - x64.max(-1, keepdims=True)), sm.OP_LOG_SOFTMAX: None}
    ref[sm.OP_SOFTMAX] /= ref[sm.OP_SOFTMAX].sum(-1, keepdims=True)
    ref[sm.OP_LOG_SOFTMAX] = cp.log(ref[sm.OP_SOFTMAX])
    for op, oname in ((sm.OP_SOFTMAX, "softmax"), (sm.OP_LOG_SOFTMAX, "log_softmax")):
        fr, err, path = {}, {}, {}
        for rnd in range(3):
            for v in VARIANTS:
                use(v)
                fn = lambda o=op: sm._softmax_impl(x, -1, o, "online", None)  # noqa: E731
                y, pl = sm._softmax_impl(x, -1, op, "online", None, return_plan=True)
                pr = next(iter(sm._PREP.values()))
                for k in pr.kernels:
                    opts = [key[2] for key, kk in _compile._KERNELS.items() if kk is k]
                    assert len(opts) == 1 and VARIANTS[v][0] in opts[0], (v, opts)
                path[v] = f"{pl.path} C={pl.chunks}"
                if rnd == 0:
                    d = cp.abs(y[sel].astype(cp.float64) - ref[op])
                    err[v] = float(cp.nanmax(cp.where(cp.isfinite(ref[op]), d, 0)))
                del y
                ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
                f = frac(rows, cols, dt, ms, copy)
                out.append(dict(round=rnd, variant=v, dtype=dname, cols=cols, op=oname, path=path[v], ms=ms,
                                frac_of_copy=f, max_abs_err=err[v]))
                fr.setdefault(v, []).append(f)
        print(dname, cols, oname, " | ".join(f"{v} ({path[v]}) " + " ".join("%.3f" % f for f in fr[v])
                                            for v in VARIANTS),
              "| split/old x%.3f" % (max(fr["split"]) / max(fr["old"])),
              "| err", {v: "%.2g" % e for v, e in err.items()}, flush=True)
    del x
_compile.get_kernel = get_kernel
bench.write_results(f"softmax_out_split_ab_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out,
                    {"copy_GBps": copy})
