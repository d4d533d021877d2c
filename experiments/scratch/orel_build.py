"""Kernel cache for orel_call.sh (wip #9, no GPU): every declared kernel (kcache_offline.py) plus the persistent
instantiations with the O stage released before the first S (OREL_LATE = 0) and after the second issue (2).
    python experiments/scratch/orel_build.py OUTDIR   (then pack OUTDIR into .kc/kc.tgz.*, see gpu_run.sh)
As run at 344a9e4: OREL_LATE = 2 was dropped in 7d208f4 (a static_assert refuses it), so at later commits build
only the 0 variant (the loop's `(0, 2)`)."""
import subprocess
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "experiments")
import kcache_offline as ko  # noqa: E402

import cuflash  # noqa: E402,F401  (declares the kernels)
from cuflash import _attention_sm90 as S, _compile  # noqa: E402

out = sys.argv[1]
if subprocess.run([sys.executable, "experiments/kcache_offline.py", out, "--jobs", "2"]).returncode:
    sys.exit(1)
ents = [(s, n, list(o) + [f"-DCUFLASH_FWD_OREL_LATE={v}"]) for v in (0, 2) for s, n, o, _r in _compile.declared()
        if s == S.SOURCE and n.replace(" ", "").endswith(",true,true>")]
sys.exit(1 if ko.build_many(ents, out, 2) else 0)
