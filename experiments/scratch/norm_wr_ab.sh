# Same-run A/B (#4): norm_sweep at hidden 1K (fwd, fwd_res) with WARP_ROWS = 2 (before) and the default, two rounds
# interleaved: experiments/results/norm_wr{2,1}_1k_<round>.json.
for r in 1 2; do
  timeout 60 python -c "import sys; sys.path[:0] = ['.', 'experiments']; import cuflash.norm as n; n.WARP_ROWS = 2
import norm_sweep as s; s.main(['--hiddens', '1024', '--ops', 'fwd,fwd_res', '--no-torch', '--name', 'norm_wr2_1k_$r'])" 2>&1 | grep -a "^fwd" | tr '\r' '\n' | grep "^fwd"
  timeout 60 python experiments/norm_sweep.py --hiddens 1024 --ops fwd,fwd_res --no-torch --name norm_wr1_1k_$r 2>&1 | tr '\r' '\n' | grep "^fwd"
done
