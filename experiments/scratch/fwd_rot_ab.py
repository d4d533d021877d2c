"""Rotated same-run A/B of Hopper forward variants with cuDNN (scratch, #9): per shape, R rounds, each timing
every contender (rep launches, median) in a rotated order (ABC, BCA, CAB, ...), so that no contender always runs
first on a cool GPU: long bf16 runs slow down as the card warms (tma at head_dim 128, 8K: 1.56 then 1.79 ms in
tmap_dyn_ab_bfloat16_0e3ef9e.json, always measured first). Reports each contender's median of the round medians
and the median of the per-round ratios. FlashAttention-2 convention (16K tokens, hidden 2048).
    python experiments/scratch/fwd_rot_ab.py [--vars tma tmap tmap@128x128x64] [--seqlens ...] [--dtype bfloat16] [--rounds 6]"""
import argparse, itertools, sys
sys.path.insert(0, ".")
sys.path.insert(0, "experiments")
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--name", default="fwd_rot_ab")
ap.add_argument("--vars", nargs="+", default=["tma", "tmap"])
ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
ap.add_argument("--causal", default="both", choices=["both", "no", "yes"])
ap.add_argument("--rep", type=int, default=10)
ap.add_argument("--rounds", type=int, default=6)
ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
a = ap.parse_args()

import cupy as cp
import cuflash
from cuflash import bench, _attention_sm90 as S90
from cuflash._attn_common import prepare
from _common import half_to_torch, sdpa_peers

th = sdpa_peers("fwd_rot_ab")
# the module settings a contender may change ("%NAME=V"), restored for the others
DEFAULTS = {k: getattr(S90, k) for spec in a.vars for kv in spec.split("%")[1:] for k in [kv.split("=")[0]]}
DT = {"bfloat16": cuflash.bfloat16, "float16": np.float16}[a.dtype]
rng = np.random.default_rng(0)
rows = []
causals = {"both": (False, True), "no": (False,), "yes": (True,)}[a.causal]
for d, n, causal in itertools.product(a.head_dims, a.seqlens, causals):
    B, H = 16384 // n, 2048 // d
    q, k, v = (cp.asarray(rng.standard_normal((B, H, n, d), dtype=np.float32)).astype(DT) for _ in range(3))
    F = 4.0 * B * H * n * n * d / (2 if causal else 1)
    fns = {}
    # "tmap", "tmap@128x128x64" (that variant with block_sizes (128, 128) and pv_n 64), "auto%LPT_GROUP_BYTES=0"
    # (with that _attention_sm90 module setting)
    for spec in a.vars:
        var, *sets = spec.split("%")
        sets = {k: int(v) for k, v in (kv.split("=") for kv in sets)}
        if "@" in var:
            vn, tile = var.split("@")
            br, bc, pv = (int(x) for x in tile.split("x"))
            p = prepare(q, k, v, causal=causal)

            def f(vn=vn, br=br, bc=bc, pv=pv, p=p, sets=sets):
                for key, val in {**DEFAULTS, **sets}.items():
                    setattr(S90, key, val)
                return S90.forward(p, (br, bc), pv_n=pv, variant=vn)[0]
        else:
            def f(var=var, sets=sets):
                for key, val in {**DEFAULTS, **sets}.items():
                    setattr(S90, key, val)
                S90.DEFAULT_VARIANT = var
                return cuflash.attention(q, k, v, causal=causal)
        fns[spec] = f
    if th is not None:
        torch, SDPBackend, sdpa_kernel = th
        tq, tk, tv = (half_to_torch(torch, x, unsigned=True) for x in (q, k, v))

        def fc():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        fns["cudnn"] = fc
    names = list(fns)
    outs = {nm: fns[nm]() for nm in a.vars}
    equal = all(bool(cp.array_equal(outs[a.vars[0]].view(cp.uint16), outs[nm].view(cp.uint16))) for nm in a.vars)
    ms = {nm: [] for nm in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if r % 2:
            order = order[::-1]
        for nm in order:
            ms[nm].append(bench.time_cuda(fns[nm], warmup=1, rep=a.rep)["median_ms"])
    S90.DEFAULT_VARIANT = a.vars[0].split("%")[0].split("@")[0]
    for key, val in DEFAULTS.items():
        setattr(S90, key, val)
    row = {"head_dim": d, "seqlen": n, "causal": causal, "bitwise_equal": equal}
    for nm in names:
        row[f"ms_{nm}"] = ms[nm]
        row[f"tflops_{nm}"] = F / (float(np.median(ms[nm])) * 1e-3) / 1e12
    base = a.vars[0]
    for nm in names[1:]:
        row[f"{nm}_over_{base}"] = float(np.median(np.asarray(ms[base]) / np.asarray(ms[nm])))
    if "cudnn" in fns:
        for nm in a.vars:
            row[f"{nm}_x_cudnn"] = float(np.median(np.asarray(ms["cudnn"]) / np.asarray(ms[nm])))
    rows.append(row)
    print(" | ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                     if not k.startswith("ms_")), flush=True)
    q = k = v = None
    outs.clear()
    fns.clear()
    cp.get_default_memory_pool().free_all_blocks()
path = bench.write_results(a.name, rows, {"what": f"Hopper forward, rotated A/B of {a.vars} with cuDNN, {a.dtype}, "
                                          f"{a.rounds} rounds x {a.rep} launches (median)"})
print("wrote", path)
