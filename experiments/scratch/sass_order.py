"""The order of the Hopper forward's consumer loop in SASS: per default 'tma' instantiation, the sequence of
HGMMA issues (G), warpgroup waits (W<n>: WARPGROUP.DEPBAR.LE gsb0, n), shuffles (s) and MUFU.EX2 (e), compressed,
compiled by this machine's NVRTC with and without -DCUFLASH_FWD_PIN=1 (scratch; needs nvdisasm on the PATH or in
the nvidia cu13 wheel). The softmax overlaps the P V wgmma when its EX2s sit between 'W1' and 'W0'.
    python experiments/scratch/sass_order.py [VARIANT ...]   (default: tma)"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sass import TOOL, nvrtc, sass
from cuflash import _dtypes, _attention_sm90 as S

print("nvrtc", nvrtc.getVersion(), "nvdisasm", TOOL)
VARS = sys.argv[1:] or ["tma"]  # variants to show (e.g. tma tmap)
for var, d in ((v, d) for v in VARS for d in (64, 128)):
    for (br, bc, pv) in S.TILES[(var, d)]:
        name = S.kernel_name(_dtypes.bfloat16, d, var, br, bc, pv)
        for label, extra in (("base", S.ARCH_OPTIONS), ("pin", S.PIN_OPTIONS)):
            ev = []
            for line in sass(S.SOURCE, name, extra).splitlines():
                if "WARPGROUP.DEPBAR" in line:
                    ev.append("W" + line.split("gsb0,")[1].strip(" ;")[-1])
                elif "HGMMA" in line and "gsb0" in line:
                    ev.append("G")
                elif "MUFU.EX2" in line:
                    ev.append("e")
                elif "SHFL.BFLY" in line:
                    ev.append("s")
            out = []
            for e in ev:
                if out and out[-1][0] == e:
                    out[-1][1] += 1
                else:
                    out.append([e, 1])
            print(f"{var} head_dim {d} Br {br} pv_n {pv} {label:4}: " + " ".join(e + (str(c) if c > 1 else "") for e, c in out))
