# Device call (#9): the longest-first head groups below LPT_MIN_SEQLEN (auto%LPT_MIN_SEQLEN=0) against the default
# (one head at a time there), causal, 512-2K, rotated; then attention_bench (the README table).
#   CUFLASH_COMMIT=<head> bash experiments/scratch/lpt_min_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 90 python experiments/scratch/fwd_rot_ab.py --causal yes --seqlens 512 1024 2048 --rounds 6 \
  --vars auto "auto%LPT_MIN_SEQLEN=0" --name lpt_min_rot_ab_${CUFLASH_COMMIT:-x} 2>&1 | sed 's/tflops_//g' \
  | cut -c1-300 | tail -7
pack
timeout 60 python experiments/attention_bench.py --rep 20 2>&1 | tail -2
pack
