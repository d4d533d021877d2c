"""The one place that turns ``cuda_src/`` into CuPy kernels.

Every wrapper asks :func:`get_kernel` for a kernel by (source file, C++ name expression). The first call
compiles the source with NVRTC through ``cupy.RawModule`` (templates instantiated by ``name_expressions``);
later calls are a dictionary lookup keyed by a cheap tuple, so a small launch costs little more than a bare
``cupy.RawKernel`` launch.

Why the options carry a hash of ``cuda_src/``: CuPy's on-disk kernel cache hashes the source string and the
options, but not the contents of ``#include``d headers. An edited ``.cuh`` would otherwise be served as a stale
cubin. ``-DCUFLASH_SRC_HASH=<sha256 of every file under cuda_src/>`` makes any edit a new cache key.

Wrappers *declare* each instantiation they can launch with :func:`declare`; :func:`declared` lists them all,
and :func:`compile_offline` compiles one with NVRTC directly (no GPU, no driver) for the CI compile check,
with the same sources and options as the runtime path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
from pathlib import Path

import numpy as np

# The CUDA sources: cuflash/cuda_src/ in a wheel or non-editable install (setup.py copies them there), else the
# checkout's cuda_src/ beside the package (editable install, or the repository on PYTHONPATH).
_PACKAGED_SRC = Path(__file__).resolve().parent / "cuda_src"
SRC_DIR = _PACKAGED_SRC if _PACKAGED_SRC.is_dir() else Path(__file__).resolve().parent.parent / "cuda_src"

# Options every kernel is built with (CuPy itself adds -ftz=true at run time; compile_offline adds it too).
BASE_OPTIONS = ("-std=c++17",)


class ConfigurationError(ValueError):
    """A kernel configuration that cannot run on this device (e.g. too much shared memory)."""


def tree_hash(root, suffixes) -> str:
    """sha256 over the files under ``root`` with one of ``suffixes`` (relative names and contents), first 16 hex
    digits."""
    h = hashlib.sha256()
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and p.suffix in suffixes:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def read_source(source: str) -> str:
    """The text of ``cuda_src/<source>``; FileNotFoundError naming the fix when the sources are not beside the
    package (an install that copied cuflash/ alone: the kernels compile at run time from cuda_src/)."""
    path = SRC_DIR / source
    if not path.is_file():
        raise FileNotFoundError(
            f"cuflash: CUDA source {source!r} not found in {SRC_DIR}: the kernels are compiled at run time from "
            "cuda_src/, which a wheel carries as cuflash/cuda_src/ and an editable install (pip install -e .) reads "
            "from the checkout; reinstall from a checkout")
    return path.read_text()


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 over every file under cuda_src/ (names and contents), first 16 hex digits."""
    return tree_hash(SRC_DIR, (".cu", ".cuh", ".h"))


@functools.lru_cache(maxsize=None)
def cuda_include_dir() -> str | None:
    """The CUDA toolkit's include folder (for cuda_fp16.h / cuda_bf16.h), or None if not found."""
    try:
        from cuda import pathfinder

        d = pathfinder.find_nvidia_header_directory("cudart")
        if d:
            return str(d)
    except Exception:  # pragma: no cover - depends on the installation
        pass
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_fp16.h").is_file():
            return str(Path(root, "include"))
    return None


def options(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The full NVRTC option tuple for a kernel (include paths, source hash, then ``extra``)."""
    opts = list(BASE_OPTIONS) + [f"-I{SRC_DIR}", f"-DCUFLASH_SRC_HASH=0x{source_hash()}"]
    inc = cuda_include_dir()
    if inc:
        opts.append(f"-I{inc}")
    return tuple(opts) + tuple(extra)


# ----------------------------------------------------------------------------------------------------------
# Declarations: what the package can launch (the CI compile check walks this list).
_DECLARED: list[tuple[str, str, tuple[str, ...], bool]] = []


def declare(source: str, names, extra_options: tuple[str, ...] = (), release: bool = True) -> None:
    """Record that ``source`` is launched with these name expressions (for the offline compile check).

    ``release=False`` marks a study configuration (e.g. a tile sweep point) where spills are reported but
    are not a failure.
    """
    for n in names:
        entry = (source, n, tuple(extra_options), release)
        if entry not in _DECLARED:
            _DECLARED.append(entry)


def declared() -> list[tuple[str, str, tuple[str, ...], bool]]:
    """Every (source, name, extra_options, release) the package declares; imports all wrapper modules."""
    import cuflash  # noqa: F401  (the wrappers declare at import time)

    return list(_DECLARED)


# ----------------------------------------------------------------------------------------------------------
# Run time: RawModule per (source, name, options, device), kept in memory.
_MODULES: dict = {}
_KERNELS: dict = {}


def _device_arch(device_id: int) -> str:
    import cupy

    return cupy.cuda.Device(device_id).compute_capability


def get_kernel(source: str, name: str, extra_options: tuple[str, ...] = ()):
    """Return the ``cupy.RawKernel`` for C++ name expression ``name`` in ``cuda_src/<source>``.

    Compiled for the current device on first use; cached in memory afterwards (and on disk by CuPy, keyed
    by the source hash in the options). Launches go to the current CuPy stream.
    """
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (source, name, extra_options, dev)
    k = _KERNELS.get(key)
    if k is not None:
        return k
    code = read_source(source)
    mod = cupy.RawModule(code=code, options=options(extra_options), name_expressions=(name,))
    k = mod.get_function(name)
    _MODULES[key] = mod
    _KERNELS[key] = k
    return k


@functools.lru_cache(maxsize=None)
def compute_capability(device_id: int) -> int:
    """The device's compute capability as an integer (``90`` for the H100/H200)."""
    return int(_device_arch(device_id))


@functools.lru_cache(maxsize=None)
def max_shared_optin(device_id: int) -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(device_id)["sharedMemPerBlockOptin"]


@functools.lru_cache(maxsize=None)
def sm_count(device_id: int) -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"]


_COUNTERS: dict = {}


def stream_counters(device_id: int):
    """Two zeroed ``uint32`` for this device and the current stream: the work counter and the blocks-done counter
    of the kernels whose blocks claim their work as they go (``norm_fwd_stream``, the persistent attention
    forward). Every such launch leaves them zero (its last block out resets them), so launches on one stream (which
    are ordered) share them; launches on two streams may overlap, hence one pair per stream. A CUDA graph captured
    on one stream keeps that stream's pair: two replays of it must not run at the same time."""
    import cupy

    key = (device_id, cupy.cuda.get_current_stream().ptr)
    t = _COUNTERS.get(key)
    if t is None:
        t = _COUNTERS[key] = cupy.zeros(2, dtype=np.uint32)
    return t


class _LaunchConfig(ctypes.Structure):  # cuda.h: CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


def max_active_clusters(kernel, cluster: int, block: int, shared_mem: int):
    """Clusters of ``cluster`` blocks of ``kernel`` (compiled with ``__cluster_dims__(cluster, 1, 1)``; ``block``
    threads and ``shared_mem`` dynamic shared bytes per block) that the device can hold at once: the driver's
    ``cuOccupancyMaxActiveClusters``, which knows how the SMs are grouped (a cluster's blocks share a GPC, so
    this can be less than SMs // cluster). None when the driver cannot say (no libcuda, an older driver)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        allow_dynamic_smem(kernel, shared_mem)  # the query, like a launch, needs the raised limit
        cfg = _LaunchConfig(cluster, 1, 1, block, 1, 1, shared_mem, None, None, 0)
        n = ctypes.c_int(0)
        rc = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(kernel.kernel.ptr), ctypes.byref(cfg))
    except (OSError, AttributeError):
        return None
    return n.value if rc == 0 and n.value > 0 else None


_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # cuda.h: CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED


def allow_non_portable_cluster(kernel) -> None:
    """Let ``kernel`` (compiled with ``__cluster_dims__`` of more than 8 blocks, e.g. 16 on Hopper) launch:
    clusters beyond the portable 8 need the function attribute NON_PORTABLE_CLUSTER_SIZE_ALLOWED, set through the
    driver (CuPy has no setter). Raises ConfigurationError where the driver refuses it."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        rc = lib.cuFuncSetAttribute(ctypes.c_void_p(kernel.kernel.ptr), _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    except (OSError, AttributeError) as e:
        raise ConfigurationError(f"cannot allow a non-portable cluster size: {e}") from e
    if rc != 0:
        raise ConfigurationError(f"the driver refused a non-portable cluster size for {kernel.name} (CUresult {rc})")


GRID_MAX = (2**31 - 1, 65535, 65535)  # CUDA's limits on gridDim.x, .y, .z


def launch(kernel, grid, block, args, shared_mem: int = 0, what="", cooperative: bool = False) -> None:
    """Launch ``kernel`` on the current stream; raise ConfigurationError if the shared memory does not fit, and
    ValueError (before launching) for a grid beyond CUDA's limits (x < 2^31, y and z <= 65535: e.g. more than
    65535 heads or batches where a kernel maps them to grid.y / grid.z).

    The 48 KiB default limit covers static plus dynamic shared memory, so whenever the two together exceed
    it the dynamic limit is raised explicitly (``cudaFuncAttributeMaxDynamicSharedMemorySize``).
    ``cooperative``: a cooperative launch (``cuLaunchCooperativeKernel``): the driver runs every block at once or
    refuses the launch, for kernels whose blocks wait on each other.
    """
    dims = grid if isinstance(grid, tuple) else (grid,)
    for n, limit, axis in zip(dims, GRID_MAX, "xyz"):
        if n > limit:
            raise ValueError(f"{_what(what, kernel)}: grid {tuple(dims)} exceeds CUDA's limit on grid.{axis} "
                             f"({limit}); the input has too many rows / heads / batches for this kernel")
    if shared_mem:
        static = _static_smem(kernel)
        if shared_mem + static > 48 * 1024:
            import cupy

            limit = max_shared_optin(cupy.cuda.runtime.getDevice())
            if shared_mem + static > limit:
                raise ConfigurationError(
                    f"{_what(what, kernel)}: needs {shared_mem} bytes of dynamic + {static} bytes of static shared "
                    f"memory per block, the device allows {limit}")
            allow_dynamic_smem(kernel, shared_mem)
    if cooperative:  # CuPy's Function call (the current stream), with its enable_cooperative_groups argument
        kernel.kernel(tuple(dims), block if isinstance(block, tuple) else (block,), args, shared_mem, None, True)
    else:
        kernel(grid, block, args, shared_mem=shared_mem)


def _what(what, kernel) -> str:
    """The launch's name for an error message (``what`` a string or a callable returning one)."""
    what = what() if callable(what) else what
    return what or kernel.name


def allow_dynamic_smem(kernel, shared_mem: int) -> None:
    """Raise ``kernel``'s dynamic shared-memory limit to ``shared_mem`` where static + dynamic exceed the 48 KiB
    default (``cudaFuncAttributeMaxDynamicSharedMemorySize``); the device's opt-in limit is the caller's check."""
    if shared_mem + _static_smem(kernel) > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < shared_mem:
        kernel.max_dynamic_shared_size_bytes = shared_mem


_STATIC_SMEM: dict = {}


def _static_smem(kernel) -> int:
    n = _STATIC_SMEM.get(kernel)
    if n is None:
        n = _STATIC_SMEM[kernel] = int(kernel.shared_size_bytes)
    return n


# ----------------------------------------------------------------------------------------------------------
# Offline: NVRTC directly, no GPU needed.
_PTXAS_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "smem": re.compile(r"(\d+) bytes smem"),
}


def compile_offline(source: str, name: str, arch: str = "90", extra_options: tuple[str, ...] = ()) -> dict:
    """Compile one instantiation with NVRTC for ``sm_<arch>`` without a GPU; return ptxas's resource report.

    Returns a dict with ``registers``, ``stack``, ``spill_stores``, ``spill_loads``, ``smem`` (static bytes),
    ``lowered`` (mangled name) and the raw ``log``. Raises RuntimeError with the compiler log on a compile error.
    """
    return compile_offline_many(source, [name], arch, extra_options)[name]


def compile_offline_many(source: str, names, arch: str = "90", extra_options: tuple[str, ...] = ()) -> dict:
    """Like :func:`compile_offline` for several name expressions of one source in one NVRTC program.

    The front end parses the source and its headers once; ptxas reports each entry separately.
    Returns {name: report}.
    """
    from cupy_backends.cuda.libs import nvrtc

    code = read_source(source)
    opts = list(options(extra_options)) + ["-ftz=true", "--ptxas-options=-v"]
    if not any(o.startswith(("--gpu-architecture", "-arch")) for o in opts):
        opts.append(f"--gpu-architecture=sm_{arch}")
    prog = nvrtc.createProgram(code, source, [], [])
    try:
        for n in names:
            nvrtc.addNameExpression(prog, n)
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"{source} {list(names)} sm_{arch}: {e}\n{nvrtc.getProgramLog(prog)}") from None
        log = nvrtc.getProgramLog(prog)
        lowered = {n: nvrtc.getLoweredName(prog, n) for n in names}
    finally:
        nvrtc.destroyProgram(prog)
    out = {}
    for n, low in lowered.items():
        # ptxas reports every entry in the program; keep the block of this one.
        block = ""
        i = log.find(f"Compiling entry function '{low}'")
        if i >= 0:
            j = log.find("Compiling entry function", i + 10)
            block = log[i: j if j > 0 else len(log)]
        rep = {k: int(m.group(1)) if (m := r.search(block)) else 0 for k, r in _PTXAS_RE.items()}
        rep.update(log=log, entry_log=block, lowered=low)
        out[n] = rep
    return out


def typed(x, ctype=np.int32):
    """A Python scalar as an explicitly typed NumPy scalar (RawKernel otherwise passes 64-bit)."""
    return ctype(x)
