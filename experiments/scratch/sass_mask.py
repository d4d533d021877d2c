"""Instruction mix of the Hopper forward's default 'tma' instantiations in SASS (scratch): how much of the kernel the
mask costs. Compiled by this machine's NVRTC (pinned, as launched), disassembled with nvdisasm (on the PATH or in
the nvidia cu13 wheel: pip install nvidia-cuda-nvdisasm). Per instantiation: instructions in all, MUFU.EX2 (one per
score: the softmax), and the integer compares / logic / predicate moves the masking compiles to.
    python experiments/scratch/sass_mask.py
At 6099e3e's per-element test (bf16, head_dim 64, Br = 64): the masked branch of the loop's softmax was 640
instructions (243 ISETP, 178 LOP3, 64 PLOP3, 64 FSEL, 49 P2R) against 297 for the softmax itself; with the
per-row bounds (wip/fwd-mask) 129 (64 ISETP with an immediate, 64 FSEL) without a left window bound, 194 with one."""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sass import sass  # noqa: E402

from cuflash import _dtypes, _attention_sm90 as S  # noqa: E402

for d in (64, 128):
    for (br, bc, pv) in S.TILES[("tma", d)]:
        listing = sass(S.SOURCE, S.kernel_name(_dtypes.bfloat16, d, "tma", br, bc, pv), S.PIN_OPTIONS)
        ops = collections.Counter()
        for line in listing.splitlines():
            m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
            if m:
                ops[m.group(1)] += 1
        print(f"d{d} Br{br} Bc{bc} pv{pv}: {sum(ops.values())} instructions, MUFU {ops['MUFU']}, ISETP "
              f"{ops['ISETP']}, LOP3 {ops['LOP3']}, PLOP3 {ops['PLOP3']}, P2R {ops['P2R']}, FSEL {ops['FSEL']}")
