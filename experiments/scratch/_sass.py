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


def sass(source: str, name: str, extra_options=()) -> str:
    """nvdisasm's listing of instantiation ``name`` of ``cuda_src/<source>``."""
    prog = nvrtc.createProgram((_compile.SRC_DIR / source).read_text(), source, [], [])
    nvrtc.addNameExpression(prog, name)
    nvrtc.compileProgram(prog, list(_compile.options(tuple(extra_options))) + ["-ftz=true"])
    cubin = nvrtc.getCUBIN(prog)
    nvrtc.destroyProgram(prog)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin + b"\0")  # getCUBIN drops the trailing byte of the ELF image
        f.flush()
        return subprocess.run([TOOL, "-c", f.name], capture_output=True, text=True).stdout
