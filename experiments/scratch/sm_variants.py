"""(Its -D knobs exist only in softmax.cu of branches wip/sm-hints and wip/timeline; on main they change nothing.
Before wip/timeline's 2026-11-30 fix this probe measured the default kernel under every variant's name: the
wrapper's prepared-launch cache (softmax._PREP) kept the first kernel; it is cleared at each switch now.) Probe (#3, scratch): softmax.cu's probe knobs (SM_CS, SM_HOLDPOL, SM_CACHED_HINT) against the default build, in
one process: each variant adds its -D options to every softmax.cu kernel it compiles (cuflash._compile.get_kernel
wrapped), shapes on the automatic plan, variants interleaved in each of three rounds, copy in the same run.
    PYTHONPATH=. python experiments/scratch/sm_variants.py          (device)
    python experiments/scratch/sm_variants.py --build DIR             (here: the variants' cubins for the cache)
Writes experiments/results/sm_variants_<commit>.json."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"base": (), "cs0": ("-DSM_CS=0",), "hold1": ("-DSM_HOLDPOL=1",), "hold2": ("-DSM_HOLDPOL=2",),
            "cs0hold1": ("-DSM_CS=0", "-DSM_HOLDPOL=1"), "chint": ("-DSM_CACHED_HINT=1",),
            "touch1": ("-DSM_TOUCH=1",), "touch2": ("-DSM_TOUCH=2",),
            "st500": ("-DSM_STAGGER=500",), "st1000": ("-DSM_STAGGER=1000",), "st2000": ("-DSM_STAGGER=2000",),
            "on4": ("-DSM_ONLINE_U=4",), "on2": ("-DSM_ONLINE_U=2",)}
REGISTER_ONLY = ("chint", "on4", "on2")  # knobs of the register kernels; st*: both; the others: the cluster's
if os.environ.get("SM_VARIANTS"):  # a subset, e.g. SM_VARIANTS=base,touch1 (the build and the run)
    VARIANTS = {k: VARIANTS[k] for k in os.environ["SM_VARIANTS"].split(",")}
SHAPES = [("bfloat16", 1024), ("bfloat16", 4096), ("bfloat16", 16384), ("float32", 16384), ("bfloat16", 32768),
          ("float32", 32768), ("bfloat16", 65536),
          ("float32", 65536), ("bfloat16", 131072), ("float32", 131072), ("bfloat16", 262144), ("float32", 262144),
          ("bfloat16", 524288)]
CACHED = ["cuflash::softmax_cached<%s, 512, 512, 8>", "cuflash::softmax_cached<%s, 256, 256, 8>"]
ALL_CACHED = ["cuflash::softmax_cached<%s, " + f"{g}, {t}, 8>" for g, t in
              [(1, 256), (2, 256), (4, 256), (8, 256), (16, 256), (32, 256), (64, 64), (128, 128), (256, 256),
               (512, 512)]]
CLUSTER = ["cuflash::softmax_cluster<%s, 256, 2, true>", "cuflash::softmax_cluster<%s, 256, 4, false>",
           "cuflash::softmax_cluster<%s, 256, 8, true>", "cuflash::softmax_cluster<%s, 256, 16, true>"]

if "--build" in sys.argv:
    sys.argv = [sys.argv[0]]
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import kcache_offline as ko  # noqa: E402
    import importlib
    sm = importlib.import_module("cuflash.softmax")
    jobs = []
    for v, opts in VARIANTS.items():
        if v == "base":
            continue  # the declared kernels: kcache_offline.py --match softmax
        names = (CACHED if v == "chint" else ALL_CACHED if v in REGISTER_ONLY else CLUSTER if not v.startswith("st")
                 else CLUSTER + ALL_CACHED)
        for ct in ("__nv_bfloat16", "float"):
            for n in names:
                extra = sm.CLUSTER_ARCH_OPTIONS if "cluster" in n else ()
                jobs.append(("softmax.cu", n % ct, list(extra) + list(opts)))
    sys.exit(1 if ko.build_many(jobs, os.environ["KC_DIR"]) else 0)

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm  # noqa: E402
from cuflash import _compile  # noqa: E402

_get = _compile.get_kernel
VAR = []


def get_kernel(source, name, extra_options=()):
    return _get(source, name, tuple(extra_options) + (tuple(VAR) if source == "softmax.cu" else ()))


sm._compile.get_kernel = get_kernel
out = []
copy = copy_bandwidth()
for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    _, pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
    for rnd in range(3):
        for v, opts in VARIANTS.items():
            if v not in ("base",) and not v.startswith("st") and (v in REGISTER_ONLY) != (pl.path != "cluster"):
                continue
            VAR[:] = opts
            sm._PREP.clear()  # the prepared launch holds the kernel: rebuild it with this variant's options
            fn = lambda: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None)  # noqa: E731
            kern = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None).kernels[0]
            assert any(kk is kern and kk_key[2][len(kk_key[2]) - len(opts):] == tuple(opts)
                       for kk_key, kk in _compile._KERNELS.items()), f"{v}: the launch's kernel lacks {opts}"
            ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
            f = frac(rows, cols, dt, ms, copy)
            out.append(dict(round=rnd, variant=v, dtype=dname, cols=cols, path=pl.path, C=pl.chunks, copy=pl.copy,
                            ms=ms, frac_of_copy=f))
    del x
print("dtype cols path C | variant: best of 3 rounds (frac of copy)")
for dname, cols in SHAPES:
    rs = [r for r in out if r["dtype"] == dname and r["cols"] == cols]
    best = {}
    for r in rs:
        best[r["variant"]] = max(best.get(r["variant"], 0), r["frac_of_copy"])
    print(dname, cols, rs[0]["path"], rs[0]["C"], " ".join(f"{v} {f:.3f}" for v, f in best.items()), flush=True)
bench.write_results(f"sm_variants_{bench.git_commit()[:7]}", out, {"copy_GBps": copy, "variants": VARIANTS})
