# Device call (#9): the tile-round probe (quant_probe.py), head_dim 128 non-causal, cuflash default vs cuDNN.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/quant_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 200 python experiments/scratch/quant_probe.py 2>&1 | tail -16
pack
