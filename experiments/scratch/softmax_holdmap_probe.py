"""Probe (#3, scratch): the cluster kernel's shared-memory hold per block (hold_bytes 32-64 KiB: 3 blocks an SM at
56-64 KiB, 4 at 32-48 KiB, the rest of each segment streamed and re-read from L2) at C = 16 and 8, bulk copies or
cp.async, on rows of 512 KiB - 2 MiB (float32 128K-512K, bfloat16 512K-1M columns) at 256 MiB, softmax; the
planner's path in every round; interleaved rounds, copy in the same run, max rel error of each variant on 2 rows.
Run 2 (PERSIST=1): C = 16, 64 KiB held, bulk, with 21-128 clusters launched (rows cluster-stride; the driver
counts 21 resident 16-block clusters on the H200) against one cluster a row.
    [PERSIST=1] PYTHONPATH=. python experiments/scratch/softmax_holdmap_probe.py [ROUNDS]       (device)"""
import os
import sys

from _softmax_probe import bench, copy_bandwidth, frac, inputs, sm

from cuflash import reference

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
VARIANTS = [None] + [(16, h, c) for h in (64, 56, 48, 40, 32) for c in ("bulk", "cp.async")]
VARIANTS += [(8, h, "bulk") for h in (64, 48)]
SHAPES = [("float32", 131072), ("float32", 262144), ("bfloat16", 524288), ("float32", 524288), ("bfloat16", 1048576)]
if os.environ.get("PERSIST"):  # run 2: C = 16 clusters launched (rows cluster-stride), 64 KiB held, bulk
    VARIANTS = [None] + [(16, 64, "bulk", k) for k in (21, 42, 63, 84, 128)]
    SHAPES = SHAPES[1:]
out = []
copy = copy_bandwidth()
print("copy GB/s %.0f" % copy, flush=True)
for dname, cols, dt, rows, (x,) in inputs(SHAPES):
    ref = reference.softmax(x[:2].get(), axis=-1)
    _, auto = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
    fr, err = {}, {}
    for rnd in range(ROUNDS):
        for v in VARIANTS:
            part = None if v is None else {"path": "cluster", "cluster": v[0], "hold_bytes": v[1] << 10, "copy": v[2]}
            name = f"auto {auto.path} {auto.chunks}" if v is None else f"C={v[0]} {v[1]}K {v[2]}"
            if v is not None and len(v) > 3:
                part["clusters"] = v[3]
                name += f" clusters={v[3]}"
            fn = lambda p=part: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", p)  # noqa: E731
            if rnd == 0:
                err[name] = bench.errors(fn()[:2], ref)["max_rel_err"]
            ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
            f = frac(rows, cols, dt, ms, copy)
            out.append(dict(round=rnd, variant=name, dtype=dname, cols=cols, ms=ms, frac_of_copy=f,
                            max_rel_err=err[name]))
            fr.setdefault(name, []).append(f)
    print(dname, cols, " | ".join(f"{k} " + " ".join("%.3f" % f for f in v) + " e%.1g" % err[k]
                                  for k, v in fr.items()), flush=True)
    del x
bench.write_results(f"softmax_holdmap_probe{os.environ.get('PERSIST', '') and '_persist'}_{os.environ.get('CUFLASH_COMMIT') or bench.git_commit()[:7]}", out,
                    {"copy_GBps": copy})
