"""SASS of one kernel instantiation without a GPU (scratch helper of sass_order.py / sass_mask.py): compiled by this
machine's NVRTC with the package's options for a source file in cuda_src/ (as launched: -ftz=true, like CuPy), then
disassembled by nvdisasm (on the PATH, or in the nvidia cu13 wheel: pip install nvidia-cuda-nvdisasm)."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, ".")
from cupy_backends.cuda.libs import nvrtc  # noqa: E402

from cuflash import _compile  # noqa: E402

TOOL = shutil.which("nvdisasm") or next(iter(glob.glob(os.path.join(
    os.path.dirname(nvrtc.__file__), "..", "..", "..", "nvidia", "cu13", "bin", "nvdisasm"))), None)


def cubin(source: str, names, extra_options=()) -> bytes:
    """The cubin of instantiations ``names`` of ``cuda_src/<source>`` in one NVRTC program (package options, as
    launched: -ftz=true, sm_90 unless the options name an architecture)."""
    opts = list(_compile.options(tuple(extra_options))) + ["-ftz=true"]
    if not any(o.startswith(("--gpu-architecture", "-arch")) for o in opts):
        opts.append("--gpu-architecture=sm_90")
    prog = nvrtc.createProgram((_compile.SRC_DIR / source).read_text(), source, [], [])
    for n in names:
        nvrtc.addNameExpression(prog, n)
    nvrtc.compileProgram(prog, opts)
    out = nvrtc.getCUBIN(prog)
    nvrtc.destroyProgram(prog)
    return out


def sass(source: str, name: str, extra_options=()) -> str:
    """nvdisasm's listing of instantiation ``name`` of ``cuda_src/<source>``."""
    cubin_ = cubin(source, [name], extra_options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin_ + b"\0")  # getCUBIN drops the trailing byte of the ELF image
        f.flush()
        return subprocess.run([TOOL, "-c", f.name], capture_output=True, text=True).stdout
