#!/usr/bin/env python3
"""A new user's probe of cuflash's researcher-facing tooling: ``cuflash.bench`` (time_cuda, flush, time_rotated,
copy_bandwidth, host_us_per_call, errors, write_results, environment), the ``cuflash`` command, the sweep scripts'
smallest runs, pytest-benchmark timing as tests/*_bench.py do it, and the report built from fresh results.

Run from the repository root on a GPU machine:

    PYTHONPATH=. python experiments/scratch/newuser_tools_probe.py            # every check
    PYTHONPATH=. python experiments/scratch/newuser_tools_probe.py sweep_     # only checks whose name contains one
    PYTHONPATH=. python experiments/scratch/newuser_tools_probe.py --list     # the names (no GPU needed)

Prints ``PASS <check>: <what was compared>``, ``FAIL <check>: <details>`` or ``SKIP <check>: <why>`` per check,
then ``SUMMARY``; exit status 1 if any check failed. Nothing is written into experiments/results/ or plots/: the
scripts run in subprocesses whose ``cuflash.bench.RESULTS`` / ``PLOTS`` point at a temporary folder (or with
``--out`` where a script has it); the last check (``no_repo_writes``) compares experiments/results/, plots/ and
experiments/REPORT.md with a snapshot taken at start, restores changed files and deletes new ones.
Environment: PROBE_BUDGET_S (default 90): no new check starts after that many seconds (the rest print SKIP, except
no_repo_writes, which always runs); PROBE_HARD_S (default 170): a watchdog reports the running check as hung and
exits 1; PROBE_OUT: folder for the scripts' outputs (default: a new temporary folder, printed at start).
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

T0 = time.time()
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402

from _probe_harness import Fail, Skip, exc_text, gpu_name, start_watchdog  # noqa: E402  (experiments/scratch)

BUDGET = float(os.environ.get("PROBE_BUDGET_S", "90"))
HARD = float(os.environ.get("PROBE_HARD_S", "170"))
LISTING = "--list" in sys.argv
OUT = Path(os.environ.get("PROBE_OUT") or (tempfile.gettempdir() + "/cuflash_tools_probe_list" if LISTING
                                           else tempfile.mkdtemp(prefix="cuflash_tools_probe_")))
RES = OUT / "results"          # where the sweeps' results go (bench.RESULTS in their subprocess)
PLT = RES / "plots"             # and their plots (bench.PLOTS)
PY = sys.executable
WATCHED = [ROOT / "experiments" / "results", ROOT / "plots", ROOT / "experiments" / "REPORT.md"]


def _exc_text(e):
    return exc_text(e, __file__)


# ------------------------------------------------------------------------------------------------------------
# harness
class Check:
    def __init__(self, name):
        self.name = name
        self.fails = []
        self.notes = []
        self.steps = 0

    def note(self, text):
        """What was compared (printed on PASS and FAIL lines alike)."""
        self.notes.append(text)

    @contextlib.contextmanager
    def sub(self, label):
        """One step: a Fail or any exception inside is recorded under ``label`` and the check goes on."""
        self.steps += 1
        try:
            yield
        except Fail as e:
            self.fails.append(f"[{label}] {e}")
        except Skip:
            raise
        except Exception as e:
            self.fails.append(f"[{label}] unexpected {_exc_text(e)}")


CHECKS = []


def check(name, gpu=True, always=False):
    def deco(f):
        CHECKS.append((name, f, gpu, always))
        return f
    return deco


def has_gpu():
    from cuflash import bench

    return bench.has_gpu()


def need_torch():
    try:
        import torch
    except Exception as e:
        raise Skip(f"torch unavailable ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    return torch


def sync():
    if has_gpu():
        import cupy as cp

        cp.cuda.Device().synchronize()


def left_s():
    return max(5.0, HARD - (time.time() - T0) - 5.0)


def run_cmd(args, timeout=None, cwd=None, env_extra=None):
    """(rc, combined output, seconds) of a subprocess; rc None when it ran past its timeout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    env.update(env_extra or {})
    t = time.time()
    try:
        p = subprocess.run(args, cwd=str(cwd or ROOT), env=env, capture_output=True, text=True,
                           timeout=min(timeout or 1e9, left_s()))
        return p.returncode, p.stdout + p.stderr, time.time() - t
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, time.time() - t


DRIVER = """
import sys, pathlib
from cuflash import bench, cli
if {patch}:
    bench.RESULTS = pathlib.Path({res!r}); bench.PLOTS = pathlib.Path({plots!r})
sys.exit(cli.main({argv!r}))
"""


def run_cli(argv, patch=True, timeout=60):
    """``cuflash <argv>`` (cuflash.cli.main) in a subprocess; with ``patch`` its results and plots go to OUT."""
    code = DRIVER.format(patch=patch, res=str(RES), plots=str(PLT), argv=list(argv))
    return run_cmd([PY, "-c", code], timeout=timeout)


def tail(text, n=600):
    t = " ".join(text.strip().split())
    return t if len(t) <= n else "..." + t[-n:]


def load_doc(name):
    p = RES / f"{name}.json"
    if not p.is_file():
        raise Fail(f"{p} not written (files there: {sorted(x.name for x in RES.glob('*'))})")
    return json.loads(p.read_text())


def _fin(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def speed_error_gaps(rows, speed_cols, err_of, skip=lambda r: False):
    """[(row label, speed col, error col wanted)] for every row whose speed column is a number but whose error
    column (``err_of(speed col)``, a name or a tuple of acceptable names) is missing or not finite."""
    gaps = []
    for r in rows:
        if skip(r):
            continue
        for c in speed_cols(r):
            if not _fin(r.get(c)):
                continue
            want = err_of(c)
            want = (want,) if isinstance(want, str) else want
            if not any(_fin(r.get(w)) for w in want):
                label = "/".join(str(r.get(k)) for k in ("impl", "op", "kind", "method", "dtype", "cols", "hidden",
                                                         "seqlen", "causal", "Bc") if k in r)
                gaps.append((label, c, "|".join(want)))
    return gaps


# ------------------------------------------------------------------------------------------------------------
# device helpers
def cp_events_ms(fn, rep, before=None):
    """Median ms of ``fn`` between CuPy events, one pair per repetition, each repetition after ``before()``."""
    import cupy as cp

    s = cp.cuda.get_current_stream()
    pairs = []
    for _ in range(rep):
        if before:
            before()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(s)
        fn()
        b.record(s)
        pairs.append((a, b))
    s.synchronize()
    return float(np.median([cp.cuda.get_elapsed_time(a, b) for a, b in pairs]))


_READ = None


def read_kernel():
    """A read-only kernel (sums float4s, writes nothing unless the sum is a sentinel): HBM or L2 read time."""
    global _READ
    if _READ is None:
        import cupy as cp

        _READ = cp.RawKernel(r'''
extern "C" __global__ void rd(const float4* __restrict__ x, long long n4, float* out) {
    float acc = 0.f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i]; acc += v.x + v.y + v.z + v.w;
    }
    if (acc == 1234.5f) out[0] = acc;
}''', "rd")
    return _READ


def reader(x):
    import cupy as cp

    k = read_kernel()
    out = cp.zeros(1, cp.float32)
    sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"]
    n4 = np.int64(x.size // 4)
    return lambda: k((sms * 8,), (256,), (x, n4, out))


_BIG = {}


def big_softmax_input():
    """65536 x 1024 float32 (256 MiB, over 4x L2): softmax reads and writes 512 MiB, ~0.13 ms on an H200."""
    import cupy as cp

    if "x" not in _BIG:
        _BIG["x"] = cp.random.standard_normal((65536, 1024), dtype=cp.float32)
    return _BIG["x"]


# ------------------------------------------------------------------------------------------------------------
# checks
@check("cli_info")
def _(c):
    """`python -m cuflash info` names the GPU (README: the command prints GPU, driver, CuPy, NVRTC)."""
    rc, out, dt = run_cmd([PY, "-m", "cuflash", "info"], timeout=60)
    c.note(f"rc {rc} in {dt:.1f} s")
    with c.sub("exit status 0"):
        if rc != 0:
            raise Fail(f"rc {rc}: {tail(out)}")
    kv = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            kv[k.strip()] = v.strip()
    c.note(f"gpu={kv.get('gpu')!r} sm_count={kv.get('sm_count')} cc={kv.get('compute_capability')} "
           f"driver={kv.get('driver')} NVRTC={kv.get('NVRTC')} commit={kv.get('commit')}")
    with c.sub("gpu line names a GPU"):
        if not kv.get("gpu") or kv["gpu"] in ("None", ""):
            raise Fail(f"gpu line {kv.get('gpu')!r}; output: {tail(out, 400)}")
    with c.sub("driver, sm_count, compute capability printed"):
        miss = [k for k in ("driver", "sm_count", "compute_capability", "l2_bytes") if not kv.get(k)]
        if miss:
            raise Fail(f"missing {miss}")
    with c.sub("NVRTC found"):
        if "not found" in kv.get("NVRTC", "not found"):
            raise Fail(f"NVRTC line {kv.get('NVRTC')!r}")


@check("environment_fields")
def _(c):
    """bench.environment(): what every results file records (GPU, SMs, L2, commit, source hashes, command)."""
    from cuflash import bench

    env = bench.environment()
    c.note("environment: " + ", ".join(f"{k}={env.get(k)!r}" for k in ("gpu", "sm_count", "l2_bytes",
                                                                       "compute_capability", "commit", "driver")))
    with c.sub("gpu / sm_count / l2_bytes"):
        if not env.get("gpu") or not env.get("sm_count") or not env.get("l2_bytes"):
            raise Fail(f"gpu {env.get('gpu')!r}, sm_count {env.get('sm_count')!r}, l2 {env.get('l2_bytes')!r}")
    with c.sub("commit identifies the code"):
        commit = str(env.get("commit"))
        if commit.startswith("unknown"):
            has_git = (ROOT / ".git").exists()
            raise Fail(f"commit {commit!r} ({'.git present' if has_git else 'no .git in this copy'}; "
                       f"CUFLASH_COMMIT {'set' if os.environ.get('CUFLASH_COMMIT') else 'unset'}); source_hashes "
                       f"{env.get('source_hashes')}")
    with c.sub("source hashes"):
        sh = env.get("source_hashes") or {}
        if not (sh.get("cuda_src") and sh.get("cuflash_py")):
            raise Fail(f"source_hashes {sh!r}")


@check("time_cuda_agrees")
def _(c):
    """time_cuda of a GPU-bound cuflash.softmax (256 MiB in, 256 MiB out) against torch.cuda.Event timing of the
    same calls, a synchronised wall clock, and the HBM floor; sync_each=True is not faster than the default."""
    import cupy as cp

    import cuflash
    from cuflash import bench

    torch = need_torch()
    x = big_softmax_input()
    f = lambda: cuflash.softmax(x, axis=-1)  # noqa: E731
    nbytes = 2 * x.nbytes
    tc = bench.time_cuda(f, warmup=3, rep=30)
    # torch events on torch's current stream (the legacy default stream, as CuPy's default stream)
    ts = torch.cuda.current_stream()
    if ts.cuda_stream != cp.cuda.get_current_stream().ptr:
        c.note(f"(torch stream {ts.cuda_stream:#x} != CuPy stream {cp.cuda.get_current_stream().ptr:#x})")
    pairs = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(ts)
        f()
        b.record(ts)
        pairs.append((a, b))
    torch.cuda.synchronize()
    te = float(np.median([a.elapsed_time(b) for a, b in pairs]))
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(30):
        f()
    cp.cuda.Device().synchronize()
    wall = (time.perf_counter() - t) / 30 * 1e3
    ts_each = bench.time_cuda(f, warmup=1, rep=20, sync_each=True)["median_ms"]
    floor = nbytes / 5.0e12 * 1e3  # 5 TB/s: above the H200's 4.8 TB/s HBM peak
    c.note(f"time_cuda median {tc['median_ms']:.4f} ms (min {tc['min_ms']:.4f}, p80 {tc['p80_ms']:.4f}); torch "
           f"events {te:.4f} ms; wall/call after sync {wall:.4f} ms; sync_each {ts_each:.4f} ms; HBM floor "
           f"{floor:.4f} ms ({nbytes / 2**20:.0f} MiB moved)")
    with c.sub("keys as documented"):
        if set(tc) != {"median_ms", "min_ms", "p20_ms", "p80_ms", "n"} or tc["n"] != 30:
            raise Fail(f"keys {sorted(tc)}, n {tc.get('n')}")
    with c.sub("time_cuda vs torch events (within 15 %)"):
        if abs(tc["median_ms"] / te - 1) > 0.15:
            raise Fail(f"time_cuda {tc['median_ms']:.4f} ms vs torch events {te:.4f} ms")
    with c.sub("time_cuda vs synchronised wall clock (wall within 0.9x..1.3x + 20 us)"):
        if not (0.9 * tc["median_ms"] <= wall <= 1.3 * tc["median_ms"] + 0.02):
            raise Fail(f"wall {wall:.4f} ms per call vs time_cuda {tc['median_ms']:.4f} ms")
    with c.sub("not faster than HBM allows"):
        if tc["median_ms"] < floor:
            raise Fail(f"{tc['median_ms']:.4f} ms < {floor:.4f} ms for {nbytes} bytes at 5 TB/s")
    with c.sub("sync_each=True not faster than the default"):
        if ts_each < 0.95 * tc["median_ms"]:
            raise Fail(f"sync_each {ts_each:.4f} ms < default {tc['median_ms']:.4f} ms")
    # a launch-bound call: sync_each includes the host work (docstring), the default hides it
    xs = cp.random.standard_normal((8, 1024), dtype=cp.float32)
    g = lambda: cuflash.softmax(xs, axis=-1)  # noqa: E731
    small = bench.time_cuda(g, warmup=3, rep=30)["median_ms"]
    small_each = bench.time_cuda(g, warmup=1, rep=30, sync_each=True)["median_ms"]
    c.note(f"8x1024: default {small * 1e3:.1f} us, sync_each {small_each * 1e3:.1f} us")
    with c.sub("small call: sync_each (host work included) >= default"):
        if small_each < 0.9 * small:
            raise Fail(f"sync_each {small_each * 1e3:.1f} us < default {small * 1e3:.1f} us")


@check("flush_l2")
def _(c):
    """time_cuda(flush=True) of a read of half the L2 is as slow as a read after evicting L2 by hand (each
    repetition a first read), and slower than the warm read (flush=False) — else the flush does not flush."""
    import cupy as cp

    from cuflash import bench

    l2 = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["l2CacheSize"]
    n = (l2 // 2) // 16 * 4  # floats, whole float4s
    x = cp.ones(n, cp.float32)
    rd = reader(x)
    junk = cp.empty(4 * l2 // 4, cp.float32)
    warm = bench.time_cuda(rd, warmup=3, rep=30)["median_ms"]
    flushed = bench.time_cuda(rd, warmup=3, rep=30, flush=True)["median_ms"]
    cold = cp_events_ms(rd, 30, before=lambda: junk.fill(2.0))
    c.note(f"read of {x.nbytes / 2**20:.1f} MiB (L2 {l2 / 2**20:.0f} MiB): warm {warm * 1e3:.1f} us, flush=True "
           f"{flushed * 1e3:.1f} us, after writing 4x L2 by hand {cold * 1e3:.1f} us")
    if warm > 0.9 * cold:
        raise Skip(f"no L2 benefit to detect at this size (warm {warm * 1e3:.1f} us, cold {cold * 1e3:.1f} us)")
    with c.sub("flush=True as slow as a cold read (>= 0.85x)"):
        if flushed < 0.85 * cold:
            raise Fail(f"flush=True {flushed * 1e3:.1f} us vs cold {cold * 1e3:.1f} us: inputs still in L2")
    with c.sub("flush=True slower than warm"):
        if flushed < 1.1 * warm:
            raise Fail(f"flush=True {flushed * 1e3:.1f} us ~ warm {warm * 1e3:.1f} us")


@check("time_rotated")
def _(c):
    """time_rotated on two reads, one twice the other: the documented result layout and a ~2x ratio that agrees
    with time_cuda of each."""
    import cupy as cp

    from cuflash import bench

    a = cp.ones(32 << 20, cp.float32)   # 128 MiB
    b = cp.ones(64 << 20, cp.float32)   # 256 MiB
    fa, fb = reader(a), reader(b)
    r = bench.time_rotated({"a": fa, "b": fb}, rounds=4, warmup=2, rep=6)
    ta = bench.time_cuda(fa, rep=20)["median_ms"]
    tb = bench.time_cuda(fb, rep=20)["median_ms"]
    c.note(f"rotated a {r['a']['median_ms']:.4f} ms, b {r['b']['median_ms']:.4f} ms (rounds a "
           f"{[round(v, 4) for v in r['a']['rounds_ms']]}); time_cuda a {ta:.4f}, b {tb:.4f}")
    with c.sub("layout {name: median_ms, rounds_ms, n}"):
        for k in ("a", "b"):
            if len(r[k]["rounds_ms"]) != 4 or r[k]["n"] != 24:
                raise Fail(f"{k}: rounds_ms {r[k]['rounds_ms']}, n {r[k]['n']} (expected 4 rounds, n 24)")
    with c.sub("b / a between 1.5 and 2.6"):
        q = r["b"]["median_ms"] / r["a"]["median_ms"]
        if not 1.5 <= q <= 2.6:
            raise Fail(f"ratio {q:.2f}")
    with c.sub("agrees with time_cuda (within 20 %)"):
        for k, t in (("a", ta), ("b", tb)):
            if abs(r[k]["median_ms"] / t - 1) > 0.2:
                raise Fail(f"{k}: rotated {r[k]['median_ms']:.4f} ms vs time_cuda {t:.4f} ms")


@check("copy_bandwidth")
def _(c):
    """copy_bandwidth(256 MiB) between 3 and 5 TB/s on an H200 and close to a torch-timed copy of the same bytes;
    at 16 MiB (what softmax_sweep --mib 16 passes it) it should still be an HBM figure."""
    import cupy as cp

    from cuflash import bench

    g = bench.copy_bandwidth(256 << 20, rep=20)
    src = cp.empty(256 << 20, cp.uint8)
    dst = cp.empty_like(src)
    ms = cp_events_ms(lambda: cp.copyto(dst, src), 20)
    manual = 2 * src.nbytes / (ms * 1e-3) / 1e9
    del src, dst
    small = bench.copy_bandwidth(16 << 20, rep=20)
    c.note(f"copy_bandwidth 256 MiB {g:.0f} GB/s; events around cp.copyto {manual:.0f} GB/s; 16 MiB {small:.0f} GB/s")
    with c.sub("3000..5000 GB/s at 256 MiB"):
        if not 3000 <= g <= 5000:
            raise Fail(f"{g:.0f} GB/s")
    with c.sub("agrees with an event-timed copy (within 10 %)"):
        if abs(g / manual - 1) > 0.10:
            raise Fail(f"{g:.0f} vs {manual:.0f} GB/s")
    with c.sub("16 MiB: still HBM (<= 5000 GB/s), the ceiling the sweeps divide by"):
        if small > 5000:
            raise Fail(f"{small:.0f} GB/s at 16 MiB: L2 bandwidth, not HBM (the copy fits in L2; a sweep run at "
                       "--mib 16 reports frac_of_copy against this)")


@check("host_us_per_call")
def _(c):
    """host_us_per_call: plausible host cost for a tiny call; equal to the GPU time for a GPU-bound call."""
    import cupy as cp

    import cuflash
    from cuflash import bench

    xs = cp.random.standard_normal((8, 1024), dtype=cp.float32)
    h = bench.host_us_per_call(lambda: cuflash.softmax(xs, axis=-1), calls=500, warmup=20)
    x = big_softmax_input()
    f = lambda: cuflash.softmax(x, axis=-1)  # noqa: E731
    hb = bench.host_us_per_call(f, calls=30, warmup=3)
    tc = bench.time_cuda(f, rep=20)["median_ms"] * 1e3
    c.note(f"8x1024 softmax {h:.1f} us/call; 65536x1024: {hb:.1f} us/call vs time_cuda {tc:.1f} us")
    with c.sub("tiny call 2..1000 us"):
        if not 2 <= h <= 1000:
            raise Fail(f"{h:.1f} us")
    with c.sub("GPU-bound call ~ GPU time (0.9x..1.3x)"):
        if not 0.9 * tc <= hb <= 1.3 * tc + 20:
            raise Fail(f"{hb:.1f} us vs {tc:.1f} us")


@check("errors_known", gpu=False)
def _(c):
    """bench.errors on known arrays (CuPy when a GPU is there, else NumPy), inf/NaN included, against its
    docstring: 'max abs error and max rel error (|out-ref| / max(|ref|, tiny)) over finite reference entries, and
    NaN count'."""
    from cuflash import bench

    if has_gpu():
        import cupy as cp

        dev = cp.asarray
    else:
        dev = np.asarray
    inf, nan = np.inf, np.nan

    def run(label, out, ref, **want):
        e = bench.errors(dev(np.asarray(out, np.float64)), np.asarray(ref, np.float64))
        c.note(f"{label}: {e['max_abs_err']:.3g}/{e['max_rel_err']:.3g}/mm{e['nonfinite_mismatch']}")
        return e

    with c.sub("basic: out [1, 2.5, -3] ref [1, 2, -3] -> abs 0.5, rel 0.25"):
        e = run("basic", [1, 2.5, -3], [1, 2, -3])
        if (e["max_abs_err"], e["max_rel_err"], e["nonfinite_mismatch"]) != (0.5, 0.25, 0):
            raise Fail(f"got {e}")
    with c.sub("NaN output at a finite reference: max_abs_err not reported as 0"):
        e = run("out NaN", [nan, 2], [1, 2])
        if e["nonfinite_mismatch"] != 1:
            raise Fail(f"nonfinite_mismatch {e['nonfinite_mismatch']}, expected 1")
        if _fin(e["max_abs_err"]) and e["max_abs_err"] == 0:
            raise Fail(f"max_abs_err 0.0 and max_rel_err {e['max_rel_err']} for an output that is NaN where the "
                       "reference is 1 (a finite reference entry); the sweeps copy only max_abs_err/max_rel_err "
                       "into their rows, so a NaN kernel reads 'error 0'")
    with c.sub("inf output at a finite reference: max_abs_err not reported as 0"):
        e = run("out inf", [inf, 2], [1, 2])
        if _fin(e["max_abs_err"]) and e["max_abs_err"] == 0:
            raise Fail(f"max_abs_err 0.0 for out=inf, ref=1 ({e})")
    with c.sub("matching NaN / same-sign inf are not mismatches"):
        e = run("nan/inf match", [nan, inf, -inf, 1], [nan, inf, -inf, 1])
        if e["nonfinite_mismatch"] != 0 or e["max_abs_err"] != 0:
            raise Fail(f"got {e}")
    with c.sub("-inf vs +inf is a mismatch"):
        e = run("-inf vs inf", [-inf, 1], [inf, 1])
        if e["nonfinite_mismatch"] != 1:
            raise Fail(f"got {e}")
    with c.sub("reference 0, output 1: rel err = 1/max(0, tiny) per docstring (huge), not 0"):
        e = run("ref 0", [1, 2], [0, 2])
        if e["max_rel_err"] < 1e6:
            raise Fail(f"max_rel_err {e['max_rel_err']} (docstring: |out-ref| / max(|ref|, tiny)); the code "
                       "zeroes the relative error wherever ref == 0")
    with c.sub("shape mismatch raises"):
        try:
            e = bench.errors(dev(np.asarray([1.0, 2.0])), np.asarray([[1.0, 2.0], [1.0, 3.0]]))
        except ValueError:
            pass
        else:
            raise Fail(f"out (2,) vs ref (2, 2) broadcast silently: {e}")


@check("write_results_files")
def _(c):
    """write_results into a temporary folder: json + csv, the environment (commit, GPU, command) in the json,
    a csv that csv.reader reads back with one field per column, strict JSON."""
    from cuflash import bench

    folder = OUT / "write_results"
    old = bench.RESULTS
    bench.RESULTS = folder
    try:
        rows = [{"impl": "cuflash", "ms": 0.125, "GBps": np.float32(4000.5), "max_abs_err": 1e-7,
                 "note": 'path "cluster", C=2'},
                {"impl": "torch", "ms": np.float64(0.25), "GBps": 2000.0, "max_abs_err": float("nan"),
                 "shape": (2, 3)}]
        path = bench.write_results("probe_rows", rows, {"what": "newuser_tools_probe"})
    finally:
        bench.RESULTS = old
    c.note(f"wrote {path}")
    with c.sub("json and csv written there"):
        if not (folder / "probe_rows.json").is_file() or not (folder / "probe_rows.csv").is_file():
            raise Fail(f"files: {sorted(p.name for p in folder.glob('*'))}")
    doc = json.loads((folder / "probe_rows.json").read_text())
    env = doc.get("environment", {})
    c.note(f"json environment gpu={env.get('gpu')!r} commit={env.get('commit')!r} command={env.get('command')!r}")
    with c.sub("json environment names the GPU, commit and command"):
        miss = [k for k in ("gpu", "commit", "command", "date") if not env.get(k)]
        if miss or str(env.get("commit")).startswith("unknown"):
            raise Fail(f"missing {miss}; commit {env.get('commit')!r}")
    with c.sub("json rows round-trip"):
        if len(doc.get("rows", [])) != 2 or doc["rows"][0]["ms"] != 0.125 or doc["meta"].get("what") is None:
            raise Fail(f"rows {doc.get('rows')}, meta {doc.get('meta')}")
    with c.sub("strict JSON (no bare NaN for a NaN error)"):
        def bad(tok):
            raise ValueError(f"non-standard JSON constant {tok}")
        try:
            json.loads((folder / "probe_rows.json").read_text(), parse_constant=bad)
        except ValueError as e:
            raise Fail(f"{e}: jq / JavaScript / strict parsers reject the file")
    with c.sub("csv: every line has one field per column"):
        lines = list(csv.reader(open(folder / "probe_rows.csv", newline="")))
        hdr = lines[0]
        wrong = [(i, len(ln)) for i, ln in enumerate(lines[1:], 1) if len(ln) != len(hdr)]
        note_val = lines[1][hdr.index("note")] if "note" in hdr and len(lines[1]) > hdr.index("note") else None
        if wrong or note_val != 'path "cluster", C=2':
            raise Fail(f"{len(hdr)} columns, lines with other counts {wrong}; 'note' read back as {note_val!r} "
                       f"(written 'path \"cluster\", C=2'): raw {(folder / 'probe_rows.csv').read_text()[:200]!r}")
    with c.sub("csv names the GPU and commit (README: 'JSON and CSV naming the GPU, the commit and the command')"):
        text = (folder / "probe_rows.csv").read_text()
        if str(env.get("gpu")) not in text or str(env.get("commit")) not in text:
            raise Fail("the CSV holds the rows only (no GPU, commit or command): a CSV copied on its own is "
                       "anonymous")


# --- pytest-benchmark, as tests/test_softmax_bench.py (synchronised) and tests/test_norm_bench.py (benchmark(f))
PB_TEST = '''
import cupy as cp
import cuflash
from cuflash import bench
from tests.test_softmax_bench import _timed   # the project's synchronised pytest-benchmark helper

X = cp.random.standard_normal((65536, 1024), dtype=cp.float32)
W = cp.ones(1024, cp.float32)


def test_softmax_bench_way(benchmark):
    f = lambda: cuflash.softmax(X, axis=-1)
    benchmark.extra_info["time_cuda_ms"] = bench.time_cuda(f, rep=20)["median_ms"]
    benchmark.extra_info["time_cuda_sync_each_ms"] = bench.time_cuda(f, rep=20, sync_each=True)["median_ms"]
    _timed(benchmark, f, 2 * X.nbytes)


def test_norm_bench_way(benchmark):
    f = lambda: cuflash.rms_norm(X, 1024, W)
    benchmark.extra_info["time_cuda_ms"] = bench.time_cuda(f, rep=20)["median_ms"]
    def call():  # as tests/test_norm_bench.py since 72fbfda: the call, then a stream synchronisation
        f()
        cp.cuda.get_current_stream().synchronize()

    benchmark.pedantic(call, rounds=20, iterations=1, warmup_rounds=3)
'''
_PB = {}


def pytest_benchmark_run():
    if "res" in _PB:
        return _PB["res"]
    d = OUT / "pytest_benchmark"
    d.mkdir(parents=True, exist_ok=True)
    (d / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (d / "test_probe_bench.py").write_text(PB_TEST)
    js = d / "bench.json"
    rc, out, dt = run_cmd([PY, "-m", "pytest", "-q", "test_probe_bench.py", "-c", "pytest.ini", "--rootdir", str(d),
                           "--benchmark-enable", f"--benchmark-json={js}", "--benchmark-max-time=0.3",
                           "--benchmark-min-rounds=20"], timeout=90, cwd=d)
    res = {"rc": rc, "out": out, "dt": dt, "bench": {}}
    if js.is_file():
        for b in json.loads(js.read_text()).get("benchmarks", []):
            res["bench"][b["name"]] = b
    _PB["res"] = res
    return res


def _pb_get(c, name):
    try:
        import pytest_benchmark  # noqa: F401
    except Exception as e:
        raise Skip(f"pytest-benchmark not importable here ({e})")
    res = pytest_benchmark_run()
    b = res["bench"].get(name)
    if b is None:
        raise Fail(f"pytest rc {res['rc']} in {res['dt']:.1f} s, no stats for {name}: {tail(res['out'])}")
    s = b["stats"]
    return {"median_ms": s["median"] * 1e3, "min_ms": s["min"] * 1e3, "mean_ms": s["mean"] * 1e3,
            "rounds": s["rounds"], **b.get("extra_info", {})}


@check("pytest_benchmark_synced")
def _(c):
    """tests/test_softmax_bench.py's _timed (call + stream synchronize per round): its median is not below
    time_cuda's GPU time and not far above one isolated call (time_cuda sync_each)."""
    s = _pb_get(c, "test_softmax_bench_way")
    c.note(f"pytest-benchmark median {s['median_ms']:.4f} ms (min {s['min_ms']:.4f}, {s['rounds']} rounds); "
           f"time_cuda {s.get('time_cuda_ms', float('nan')):.4f} ms, sync_each "
           f"{s.get('time_cuda_sync_each_ms', float('nan')):.4f} ms")
    with c.sub("not faster than the GPU time (>= 0.9x time_cuda)"):
        if s["median_ms"] < 0.9 * s["time_cuda_ms"]:
            raise Fail(f"{s['median_ms']:.4f} ms < time_cuda {s['time_cuda_ms']:.4f} ms")
    with c.sub("not far above one isolated call (<= 1.5x sync_each + 50 us)"):
        if s["median_ms"] > 1.5 * s["time_cuda_sync_each_ms"] + 0.05:
            raise Fail(f"{s['median_ms']:.4f} ms vs sync_each {s['time_cuda_sync_each_ms']:.4f} ms")
    with c.sub("extra_info GBps present"):
        if not _fin(s.get("GBps")):
            raise Fail(f"extra_info {sorted(k for k in s)}")


@check("pytest_benchmark_norm_way")
def _(c):
    """tests/test_norm_bench.py's way (it called benchmark(f) unsynchronised until 72fbfda, which timed the launch):
    the figure pytest-benchmark prints for it is the op's time, not its launch cost."""
    s = _pb_get(c, "test_norm_bench_way")
    c.note(f"pytest-benchmark median {s['median_ms']:.4f} ms, min {s['min_ms']:.4f}, mean {s['mean_ms']:.4f} "
           f"({s['rounds']} rounds); time_cuda {s.get('time_cuda_ms', float('nan')):.4f} ms")
    with c.sub("median >= 0.8x time_cuda"):
        if s["median_ms"] < 0.8 * s["time_cuda_ms"]:
            raise Fail(f"median {s['median_ms']:.4f} ms vs GPU time {s['time_cuda_ms']:.4f} ms: the unsynchronised "
                       "host timer reports the launch, not the norm")
    with c.sub("min >= 0.5x time_cuda (no round far faster than the GPU can run it)"):
        if s["min_ms"] < 0.5 * s["time_cuda_ms"]:
            raise Fail(f"min {s['min_ms']:.4f} ms vs GPU time {s['time_cuda_ms']:.4f} ms (rounds timed while the "
                       "launch queue fills)")


# --- the sweep scripts' smallest runs, through the cuflash command, results redirected to OUT
SOFTMAX_ARGS = ["--mib", "16", "--cols", "1024", "--dtypes", "float32", "--methods", "online,safe", "--rep", "5",
                "--warmup", "1"]


@check("sweep_softmax")
def _(c):
    """`cuflash run softmax_sweep` (smallest: 16 MiB, cols 1024, float32, online+safe, peers and log_softmax on):
    exit 0, results json with environment, every speed beside a finite max_abs_err and max_rel_err."""
    rc, out, dt = run_cli(["run", "softmax_sweep"] + SOFTMAX_ARGS, timeout=90)
    c.note(f"cuflash run softmax_sweep {' '.join(SOFTMAX_ARGS)}: rc {rc} in {dt:.1f} s")
    with c.sub("exit status 0"):
        if rc != 0:
            raise Fail(f"rc {rc}: {tail(out, 500)}")
    doc = load_doc("softmax_sweep")
    rows = doc.get("rows", [])
    c.note(f"{len(rows)} rows: " + ", ".join(f"{r.get('impl')}/{r.get('method') or '-'}" for r in rows))
    with c.sub("rows with a speed"):
        timed = [r for r in rows if _fin(r.get("ms"))]
        if len(timed) < 3:
            raise Fail(f"{len(timed)} timed rows; errors: {[r.get('error') for r in rows if r.get('error')]}")
    with c.sub("every speed beside max_abs_err and max_rel_err"):
        gaps = speed_error_gaps(rows, lambda r: [k for k in ("ms", "GBps") if k in r], lambda k: "max_abs_err")
        gaps += speed_error_gaps(rows, lambda r: [k for k in ("ms", "GBps") if k in r], lambda k: "max_rel_err")
        if gaps:
            raise Fail(f"{len(gaps)} speed figures without a finite error: {gaps[:6]}")
    with c.sub("environment: GPU, commit, command"):
        env = doc.get("environment", {})
        if not env.get("gpu") or "softmax_sweep" not in str(env.get("command")):
            raise Fail(f"gpu {env.get('gpu')!r}, command {env.get('command')!r}")
    with c.sub("plot written beside the results (redirected)"):
        if not (PLT / "softmax_bandwidth.png").is_file():
            raise Fail(f"no {PLT / 'softmax_bandwidth.png'}")


NORM_ARGS = ["--hiddens", "1024", "--dtypes", "float32", "--kinds", "rms", "--ops", "fwd,bwd", "--mib", "16",
             "--rep", "5", "--warmup", "1", "--no-triton"]


@check("sweep_norm")
def _(c):
    """`cuflash run norm_sweep` (smallest: hidden 1024, float32, rms, fwd+bwd, 16 MiB, torch peer): exit 0, every
    speed of an implementation (copy rows aside) beside a finite max_abs_err."""
    rc, out, dt = run_cli(["run", "norm_sweep"] + NORM_ARGS, timeout=90)
    c.note(f"cuflash run norm_sweep {' '.join(NORM_ARGS)}: rc {rc} in {dt:.1f} s")
    with c.sub("exit status 0"):
        if rc != 0:
            raise Fail(f"rc {rc}: {tail(out, 500)}")
    doc = load_doc("norm_sweep")
    rows = doc.get("rows", [])
    c.note(f"{len(rows)} rows: " + ", ".join(f"{r.get('impl')}/{r.get('op')}" for r in rows))
    with c.sub("cuflash fwd and bwd rows timed"):
        got = {(r.get("impl"), r.get("op")) for r in rows if _fin(r.get("ms"))}
        if not {("cuflash", "fwd"), ("cuflash", "bwd")} <= got:
            raise Fail(f"timed rows {sorted(got)}")
    with c.sub("every speed (copy aside) beside max_abs_err"):
        gaps = speed_error_gaps(rows, lambda r: [k for k in ("ms", "GBps") if k in r], lambda k: "max_abs_err",
                                skip=lambda r: r.get("impl") == "copy")
        if gaps:
            raise Fail(f"{len(gaps)} speed figures without an error: {sorted({g[0] for g in gaps})} (README: "
                       "'every speed figure is reported beside its error figure')")
    with c.sub("plot redirected"):
        if not (PLT / "norm_bandwidth.png").is_file():
            raise Fail(f"no {PLT / 'norm_bandwidth.png'}")


ATTN_ARGS = ["--seqlens", "512", "--head-dims", "64", "--dtypes", "bfloat16", "--masks", "causal", "--rep", "20",
             "--warmup", "1", "--no-wgmma"]


@check("sweep_attention")
def _(c):
    """`cuflash run attention_bench` (smallest: seqlen 512, d 64, bfloat16, causal, no wgmma): exit 0, each
    <impl>_tflops beside a finite <impl>_err, cuflash's error at bfloat16 level."""
    rc, out, dt = run_cli(["run", "attention_bench"] + ATTN_ARGS, timeout=90)
    c.note(f"cuflash run attention_bench {' '.join(ATTN_ARGS)}: rc {rc} in {dt:.1f} s")
    with c.sub("exit status 0"):
        if rc != 0:
            raise Fail(f"rc {rc}: {tail(out, 500)}")
    doc = load_doc("attention_bench")
    rows = doc.get("rows", [])
    with c.sub("one row, cuflash timed"):
        if len(rows) != 1 or not _fin(rows[0].get("cuflash_tflops")):
            raise Fail(f"rows {rows}")
    r = rows[0]
    c.note(", ".join(f"{k}={r[k]:.4g}" for k in sorted(r) if k.endswith(("_tflops", "_err")) and _fin(r[k])))
    with c.sub("every *_tflops beside its *_err"):
        gaps = speed_error_gaps(rows, lambda r: [k for k in r if k.endswith("_tflops")],
                                lambda k: k[: -len("_tflops")] + "_err")
        if gaps:
            raise Fail(f"{gaps}")
    with c.sub("cuflash error plausible for bfloat16 (< 0.05)"):
        if not r["cuflash_err"] < 0.05:
            raise Fail(f"cuflash_err {r['cuflash_err']}")


FIG2_ARGS = ["--quick", "--batch", "1", "--heads", "2", "--seqlen", "256", "--block-sizes", "64", "--ncu", "off",
             "--no-torch", "--rep", "20", "--warmup", "1"]


@check("fig2_small")
def _(c):
    """`cuflash run fig2 ... --out DIR` (tiny shape, one fa1 block size, no ncu, no torch): exit 0, results and
    plot under DIR (not experiments/results, not plots/), measured, every fwd_ms beside a finite max_abs_err."""
    out_dir = RES  # fig2 has --out: use it instead of patching
    rc, out, dt = run_cli(["run", "fig2"] + FIG2_ARGS + ["--out", str(out_dir)], patch=False, timeout=90)
    c.note(f"cuflash run fig2 {' '.join(FIG2_ARGS)} --out DIR: rc {rc} in {dt:.1f} s")
    with c.sub("exit status 0"):
        if rc != 0:
            raise Fail(f"rc {rc}: {tail(out, 500)}")
    doc = load_doc("fig2_quick")  # --quick runs are named <name>_quick (never the committed fig2.json)
    rows = doc.get("rows", [])
    with c.sub("measured, not predicted"):
        if (doc.get("meta") or {}).get("predicted") or not rows:
            raise Fail(f"meta {doc.get('meta', {}).get('predicted')}, {len(rows)} rows")
    c.note(", ".join(f"{r.get('impl')}{'/Bc' + str(r['Bc']) if 'Bc' in r else ''}: fwd {r.get('fwd_ms', 0):.4g} ms "
                     f"err {r.get('max_abs_err')}" for r in rows))
    with c.sub("errors recorded"):
        bad = [r.get("error") for r in rows if r.get("error")]
        if bad:
            raise Fail(f"rows with errors: {bad[:3]}")
    with c.sub("every fwd_ms beside max_abs_err"):
        gaps = speed_error_gaps(rows, lambda r: ["fwd_ms"], lambda k: "max_abs_err")
        if gaps:
            raise Fail(f"{gaps}")
    with c.sub("fwdbwd_ms beside a backward error"):
        gaps = speed_error_gaps(rows, lambda r: ["fwdbwd_ms"],
                                lambda k: "bwd_max_abs_err")
        if gaps:
            raise Fail(f"{gaps} (only the forward output is checked; the fwd+bwd time has no error figure)")
    with c.sub("plot under DIR/plots"):
        if not (out_dir / "plots" / "fig2_quick.png").is_file():
            raise Fail(f"no {out_dir / 'plots' / 'fig2_quick.png'}")


@check("report_fresh")
def _(c):
    """`cuflash report --results DIR` on the results the checks above wrote: the judged table has the cuflash
    rows of each fresh file, each with an error figure."""
    rep = OUT / "REPORT.md"
    made = sorted(p.stem for p in RES.glob("*.json"))
    if not made:
        raise Skip("no fresh results (the sweep checks did not run or wrote nothing)")
    rc, out, dt = run_cmd([PY, "-m", "cuflash", "report", "--results", str(RES), "--plots", str(PLT), "--out",
                           str(rep)], timeout=60)
    c.note(f"report over {made}: rc {rc} in {dt:.1f} s")
    with c.sub("exit status 0 and file written"):
        if rc != 0 or not rep.is_file():
            raise Fail(f"rc {rc}: {tail(out)}")
    lines = rep.read_text().splitlines()
    try:
        i = next(k for k, ln in enumerate(lines) if ln.startswith("## The table every kernel is judged by"))
    except StopIteration:
        raise Fail("no judged table")
    tab = []
    for ln in lines[i + 1:]:
        if ln.startswith("## "):
            break
        if ln.startswith("| ") and not ln.startswith("| source"):
            tab.append([x.strip() for x in ln.strip().strip("|").split("|")])
    cu = [r for r in tab if len(r) >= 7 and "cuflash" in r[1]]
    no_err = [f"{r[0]}: {r[1]}" for r in cu if not r[4] and not r[5]]
    c.note(f"judged rows {len(tab)}, cuflash rows {len(cu)}, cuflash rows without error {len(no_err)}")
    with c.sub("each fresh sweep file appears in the judged table"):
        srcs = {r[0].split(" ")[0] for r in tab}
        miss = [m for m in made if m in ("softmax_sweep", "norm_sweep", "attention_bench") and m not in srcs]
        if miss:
            raise Fail(f"missing {miss}; sources {sorted(srcs)}")
    with c.sub("every cuflash row of the judged table carries an error"):
        if no_err:
            raise Fail(f"{no_err[:6]}")


@check("attention_bench_dtype_label")
def _(c):
    """attention_bench --dtypes float32 (no choices declared): either rejected, or rows labelled float32 whose
    error is at float32 level. The code maps every name other than bfloat16 to float16."""
    d = OUT / "dtype_label"
    code = DRIVER.format(patch=True, res=str(d), plots=str(d / "plots"),
                         argv=["run", "attention_bench", "--seqlens", "128", "--head-dims", "64", "--dtypes",
                               "float32", "--masks", "full", "--rep", "20", "--warmup", "1", "--no-wgmma",
                               "--no-torch"])
    rc, out, dt = run_cmd([PY, "-c", code], timeout=60)
    c.note(f"attention_bench --dtypes float32 --seqlens 128: rc {rc} in {dt:.1f} s")
    p = d / "attention_bench.json"
    if not p.is_file():
        with c.sub("rejected with a message naming the dtype"):
            if rc == 0 or "float32" not in out:
                raise Fail(f"rc {rc}, no results, output: {tail(out, 400)}")
            c.note("rejected: " + tail(out, 200))
        return
    r = json.loads(p.read_text())["rows"][0]
    c.note(f"row dtype {r.get('dtype')!r}, cuflash_err {r.get('cuflash_err')}")
    with c.sub("a float32-labelled row has float32-level error (< 1e-4)"):
        if r.get("dtype") == "float32" and not (r.get("cuflash_err", 1) < 1e-4):
            raise Fail(f"labelled float32 but max abs err {r.get('cuflash_err'):.3g} (half precision): "
                       "the float32 request ran float16 and was recorded as float32")


@check("time_cuda_bad_rep")
def _(c):
    """time_cuda(fn, rep=0) and rep=-1: a clear error naming rep (not a NumPy reduction message)."""
    from cuflash import bench

    import cupy as cp

    x = cp.ones(1024, cp.float32)
    for rep in (0, -1):
        with c.sub(f"rep={rep}"):
            try:
                r = bench.time_cuda(lambda: x.sum(), rep=rep)
            except Exception as e:
                c.note(f"rep={rep}: {type(e).__name__}: {str(e)[:120]}")
                if "rep" not in str(e):
                    raise Fail(f"{type(e).__name__}: {str(e)[:160]} (does not name rep)")
            else:
                raise Fail(f"no error, returned {r}")


# ------------------------------------------------------------------------------------------------------------
# nothing written into the checkout
def snapshot():
    snap = {}
    for w in WATCHED:
        files = [w] if w.is_file() else (list(w.rglob("*")) if w.is_dir() else [])
        for p in files:
            if p.is_file():
                st = p.stat()
                snap[str(p.relative_to(ROOT))] = (st.st_size, st.st_mtime_ns)
    return snap


SNAP = {}
BACKUP = OUT / "_backup"


def take_snapshot():
    SNAP.update(snapshot())
    for rel in SNAP:
        dst = BACKUP / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst)


@check("no_repo_writes", gpu=False, always=True)
def _(c):
    """experiments/results/, plots/ and experiments/REPORT.md as at start; changed files restored, new removed."""
    now = snapshot()
    new = sorted(set(now) - set(SNAP))
    changed = sorted(k for k in set(now) & set(SNAP) if now[k] != SNAP[k])
    gone = sorted(set(SNAP) - set(now))
    c.note(f"{len(SNAP)} files watched; new {len(new)}, changed {len(changed)}, removed {len(gone)}")
    for rel in changed + gone:
        src = BACKUP / rel
        if src.is_file():
            (ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ROOT / rel)
    for rel in new:
        with contextlib.suppress(OSError):
            (ROOT / rel).unlink()
    with c.sub("unchanged"):
        if new or changed or gone:
            raise Fail(f"new {new[:8]}, changed {changed[:8]}, removed {gone[:8]} (restored / deleted)")


ORDER = ["cli_info", "environment_fields", "errors_known", "write_results_files", "time_cuda_agrees", "flush_l2",
         "copy_bandwidth", "time_rotated", "host_us_per_call", "time_cuda_bad_rep", "pytest_benchmark_synced",
         "pytest_benchmark_norm_way", "sweep_softmax", "sweep_norm", "sweep_attention", "fig2_small", "report_fresh",
         "attention_bench_dtype_label", "no_repo_writes"]


def main():
    rank = {n: i for i, n in enumerate(ORDER)}
    checks = sorted(CHECKS, key=lambda t: rank.get(t[0], len(ORDER)))
    if "--list" in sys.argv:
        for name, f, gpu, _a in checks:
            doc = " ".join((f.__doc__ or "").split())
            print(f"{name}{'' if gpu else '  (no GPU needed)'}: {doc[:150]}")
        return 0
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    gpu_ok = has_gpu()
    try:
        import cupy as cp

        if gpu_ok:
            gpu = gpu_name(cp)
        else:
            gpu = "none"
        cpv = cp.__version__
    except Exception as e:
        gpu, cpv = f"? ({_exc_text(e)})", "?"
    try:
        import torch

        tv = torch.__version__
    except Exception as e:
        tv = f"unavailable ({type(e).__name__})"
    RES.mkdir(parents=True, exist_ok=True)
    take_snapshot()
    print(f"# newuser_tools_probe: GPU {gpu}; cupy {cpv}, torch {tv}; outputs in {OUT}; budget {BUDGET:.0f} s",
          flush=True)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    state = {"name": None, "t": time.time()}

    def report_changed():  # the watchdog's last word: what the run left changed under the checkout
        try:
            nr = [k for k, v in snapshot().items() if SNAP.get(k) != v]
            if nr:
                print(f"# files changed under the checkout (not restored): {nr[:8]}", flush=True)
        except Exception:
            pass

    start_watchdog(T0, HARD, state, counts, why="hung or far too slow", on_abort=report_changed)
    for name, f, gpu_needed, always in checks:
        if only and not always and not any(s in name for s in only):
            continue
        if not always and time.time() - T0 > BUDGET:
            print(f"SKIP {name}: time budget of {BUDGET:.0f} s spent (PROBE_BUDGET_S)", flush=True)
            counts["SKIP"] += 1
            continue
        if gpu_needed and not gpu_ok:
            print(f"SKIP {name}: no CUDA device visible to CuPy", flush=True)
            counts["SKIP"] += 1
            continue
        c = Check(name)
        state["name"], state["t"] = name, time.time()
        try:
            f(c)
        except Skip as e:
            print(f"SKIP {name}: {e}" + (f"  ({'; '.join(c.notes)})" if c.notes else ""), flush=True)
            counts["SKIP"] += 1
            continue
        except Fail as e:
            c.fails.append(str(e))
        except Exception as e:
            c.fails.append(f"unexpected {_exc_text(e)}")
        try:
            sync()
        except Exception as e:
            c.fails.append(f"device error after the check: {_exc_text(e)}")
        dt = time.time() - state["t"]
        what = f" -- {'; '.join(c.notes)}" if c.notes else ""
        if c.fails:
            counts["FAIL"] += 1
            print(f"FAIL {name}: " + " | ".join(c.fails) + f"  [{len(c.fails)} of {c.steps} steps failed, {dt:.1f} s]"
                  + what, flush=True)
        else:
            counts["PASS"] += 1
            print(f"PASS {name}  [{c.steps} steps, {dt:.1f} s]{what}", flush=True)
        if gpu_ok:
            with contextlib.suppress(Exception):
                import cupy as cp

                cp.get_default_memory_pool().free_all_blocks()
    total = sum(counts.values())
    print(f"SUMMARY: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped of {total} checks "
          f"in {time.time() - T0:.1f} s", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
