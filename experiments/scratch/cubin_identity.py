"""Whether a source edit changes any kernel (scratch, no GPU): the sha256 of the cubin of every declared
instantiation of cuda_src/SOURCE whose name holds SUBSTR, one NVRTC program per option set; run it before and after
the edit. The CUFLASH_SRC_HASH define (the kernel cache's key, changed by any edit) is left out: it is not in the code.
    python experiments/scratch/cubin_identity.py SOURCE [SUBSTR]"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sass import cubin  # noqa: E402

from cuflash import _compile  # noqa: E402

source, sub = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
groups = {}
for s, n, o, _r in _compile.declared():
    if s == source and sub in n:
        groups.setdefault(tuple(o), []).append(n)
real = _compile.options
_compile.options = lambda extra=(): tuple(x for x in real(extra) if not x.startswith("-DCUFLASH_SRC_HASH"))
for opts, names in groups.items():
    print(len(names), "kernels", " ".join(opts) or "(no extra options)",
          hashlib.sha256(cubin(source, names, opts)).hexdigest()[:16])
