#!/usr/bin/env bash
# One device call for wip/ln-stream-stages (#4): same-run A/B of the LayerNorm forward rows on norm_fwd_stream
# (float32 16K, bfloat16 32K; three rows staged against two) and their neighbours against main's tree (abm/),
# interleaved three times.   CUFLASH_COMMIT=<hash> bash experiments/scratch/ln_stages_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
norm_vs_tree ln_stages 3 "--kinds layer,rms --ops fwd --dtypes float32,bfloat16 --hiddens 8192,16384,32768 --no-torch --no-triton --rep 30"
