"""Fill the H200 device machine's CuPy kernel cache on this machine, without a GPU.

CuPy names a cache entry by a hash of the source, the NVRTC options (which hold install paths: CuPy's headers and
the CUDA include directory), NVRTC's version and the architecture. This script compiles every declared kernel
(``cuflash._compile.declared()``, what the test suite's warm-up compiles) with the local NVRTC for sm_90 and stores
it under the name the device's CuPy computes from the device's paths, so a GPU call that carries the cache
(``.kc/kc.tgz.*``, see ``experiments/gpu_run.sh``) loads instead of compiling (about 250 s of device time for a
changed ``cuda_src/``). The entries are byte-identical to the device's own when the CuPy and NVRTC versions
match (checked at 14.2 / 13.0); a mismatch only costs a compile there.

    python experiments/kcache_offline.py OUTDIR [--jobs N] [--match SUBSTR] [--any-nvrtc]
    (cd OUTDIR && tar czf - . | split -b 15m - ../.kc/kc.tgz.)      # then carry [".kc"]

DEVICE_SITE / DEVICE_CUDA_INCLUDE / DEVICE_ROOT below are the device's paths; the source tree is read when each
kernel is compiled, so keep it unchanged while this runs (or run it from a git worktree of the commit).
"""
import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cupy._core.core as core  # noqa: E402
import cupy.cuda.compiler as cc  # noqa: E402

ARCH = "90"
LOCAL_SITE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(cc.__file__))))  # site-packages
DEVICE_SITE = "/opt/torch/.venv/lib/python3.12/site-packages"
# the checkout's path on the device machine (its cuda_src/ is an include path); CUFLASH_DEVICE_ROOT for a second
# source tree run there beside it (experiments/scratch/ab_tree.sh: /work/main/abm)
DEVICE_ROOT = os.environ.get("CUFLASH_DEVICE_ROOT", "/work/main")
DEVICE_CUDA_INCLUDE = DEVICE_SITE + "/nvidia/cu13/include"
# CuPy's cache key holds NVRTC's version: entries built by another NVRTC all miss on the device, which then compiles
# every kernel (a 2026-12-01 call: NVRTC 13.5 here against 13.0 there, 360 s of warm-up). Pin it in the build venv:
#   pip install "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-runtime==13.0.*"
DEVICE_NVRTC = (13, 0)

# No driver here: CuPy's architecture queries answer sm_90.
cc._get_arch = lambda: ARCH
cc._get_max_compute_capability = lambda: ARCH
cc._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{ARCH}", "cubin")


def _cupy_options(code: str, options: tuple, name: str):
    """The options and extra source CuPy's RawModule passes to its cached compile (its own headers added)."""
    seen = {}
    real = cc._compile_with_cache_cuda

    def spy(source, opts, arch, extra_source, *a, **k):
        seen.update(options=opts, extra=extra_source)
        raise StopIteration

    cc._compile_with_cache_cuda = spy
    try:
        core.compile_with_cache(code, options, prepend_cupy_headers=False, name_expressions=(name,))
    except StopIteration:
        pass
    finally:
        cc._compile_with_cache_cuda = real
    return seen["options"], seen["extra"]


def _cache_name(code: str, options: tuple, extra: str, name: str) -> str:
    """CuPy 14.2's cache file name (cupy.cuda.compiler._compile_with_cache_cuda)."""
    options = tuple(options) + ("-ftz=true",)
    env = (ARCH, options, cc._get_nvrtc_version(), "nvrtc", f"-arch=sm_{ARCH}", "cubin")
    base = cc._preprocess("", options, ARCH, "nvrtc")
    key = "%s %s %s %s %s" % (env, base, code, extra, cc._get_cupy_cache_key())
    key += " ne%d " % cc._cache_payload_version + name
    return cc._hash_hexdigest(key.encode("utf-8")) + ".cubin"


def build(entry, outdir: str) -> str:
    from cuflash import _compile

    source, name, extra_options = entry
    code = (_compile.SRC_DIR / source).read_text()
    local_inc = _compile.cuda_include_dir() or "\0"
    local_root = str(_compile.SRC_DIR.parent)  # a worktree elsewhere builds the same names as /work/main
    opts, extra = _cupy_options(code, _compile.options(tuple(extra_options)), name)
    device_opts = [o.replace(LOCAL_SITE, DEVICE_SITE).replace(local_inc, DEVICE_CUDA_INCLUDE)
                   .replace(local_root + "/", DEVICE_ROOT + "/") for o in opts]
    fname = _cache_name(code, device_opts, extra, name)
    if os.path.exists(os.path.join(outdir, fname)):
        return "have"
    full = tuple(opts) + ("-ftz=true", f"-arch=sm_{ARCH}", "--device-as-default-execution-space")
    if cc._get_nvrtc_version() >= (12, 8) and cc._use_pch:
        full += ("--pch",)
    prog = cc._NVRTCProgram(code, "", (), (), name_expressions=(name,), method="cubin")
    cubin, mapping = prog.compile(full)
    type(cc._kernel_cache_backend)(outdir).save(fname, cc._encode_cache_payload([mapping[name]], cubin), code)
    return "built"


def _work(args):
    entry, outdir = args
    try:
        return entry, build(entry, outdir)
    except Exception as e:  # report and go on: the device compiles what is missing
        return entry, f"ERROR {e!r}"[:400]


def build_many(entries, outdir, jobs=2):
    """Compile ``entries`` ((source, name, options) each) into ``outdir``, ``jobs`` processes at a time; prints the
    failures and the progress; returns how many failed. Also for the scratch probes' variant builds (-D options
    added to declared kernels)."""
    os.makedirs(outdir, exist_ok=True)
    failed = 0
    with mp.get_context("fork").Pool(jobs) as pool:
        for i, (entry, what) in enumerate(pool.imap_unordered(_work, [(e, outdir) for e in entries]), 1):
            if what.startswith("ERROR"):
                failed += 1
                print(entry[:2], what, flush=True)
            if i % 50 == 0:
                print(f"{i}/{len(entries)}", flush=True)
    return failed


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    outdir = argv[0]
    from cupy_backends.cuda.libs import nvrtc

    if tuple(nvrtc.getVersion()) != DEVICE_NVRTC and "--any-nvrtc" not in argv:
        print(f"kcache_offline: NVRTC {nvrtc.getVersion()} here, the device's is {DEVICE_NVRTC}: its cache keys would "
              "all miss there. Install that NVRTC (see DEVICE_NVRTC) or pass --any-nvrtc.", file=sys.stderr)
        return 2
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else os.cpu_count()
    match = argv[argv.index("--match") + 1] if "--match" in argv else None
    os.makedirs(outdir, exist_ok=True)
    import importlib

    importlib.import_module("cuflash")  # every module declares its kernels on import
    from cuflash import _compile

    entries = [(s, n, list(o)) for s, n, o, _r in _compile.declared() if match is None or match in s + n]
    failed = build_many(entries, outdir, jobs)
    if match is None and not failed:  # every declared kernel of these sources: experiments/gpu_run.sh checks this
        with open(os.path.join(outdir, "SOURCE_HASHES"), "a") as f:
            f.write(_compile.source_hash() + "\n")
    print(f"{len(entries)} declared kernels, {failed} failed; {len(os.listdir(outdir))} files in {outdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
