"""Instruction mix of the Hopper forward's default 'tma' instantiations in SASS (scratch): how much of the kernel the
mask costs. Compiled by this machine's NVRTC (pinned, as launched), disassembled with nvdisasm (on the PATH or in
the nvidia cu13 wheel: pip install nvidia-cuda-nvdisasm). Per instantiation: instructions in all, MUFU.EX2 (one per
score: the softmax), and the integer compares / logic / predicate moves the masking compiles to.
    python experiments/scratch/sass_mask.py
At 6099e3e's per-element test (bf16, head_dim 64, Br = 64): the masked branch of the loop's softmax was 640
instructions (243 ISETP, 178 LOP3, 64 PLOP3, 64 FSEL, 49 P2R) against 297 for the softmax itself; with the
per-row bounds (wip/fwd-mask) 129 (64 ISETP with an immediate, 64 FSEL) without a left window bound, 194 with one."""
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, ".")
from cupy_backends.cuda.libs import nvrtc  # noqa: E402

from cuflash import _compile, _dtypes, _attention_sm90 as S  # noqa: E402

tool = shutil.which("nvdisasm") or next(iter(glob.glob(os.path.join(
    os.path.dirname(nvrtc.__file__), "..", "..", "..", "nvidia", "cu13", "bin", "nvdisasm"))), None)
code = (_compile.SRC_DIR / S.SOURCE).read_text()
for d in (64, 128):
    for (br, bc, pv) in S.TILES[("tma", d)]:
        name = S.kernel_name(_dtypes.bfloat16, d, "tma", br, bc, pv)
        prog = nvrtc.createProgram(code, S.SOURCE, [], [])
        nvrtc.addNameExpression(prog, name)
        nvrtc.compileProgram(prog, list(_compile.options(S.PIN_OPTIONS)) + ["-ftz=true"])
        cubin = nvrtc.getCUBIN(prog)
        nvrtc.destroyProgram(prog)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin + b"\0")  # getCUBIN drops the trailing byte of the ELF image
            f.flush()
            sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True).stdout
        ops = collections.Counter()
        for line in sass.splitlines():
            m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
            if m:
                ops[m.group(1)] += 1
        print(f"d{d} Br{br} Bc{bc} pv{pv}: {sum(ops.values())} instructions, MUFU {ops['MUFU']}, ISETP "
              f"{ops['ISETP']}, LOP3 {ops['LOP3']}, PLOP3 {ops['PLOP3']}, P2R {ops['P2R']}, FSEL {ops['FSEL']}")
