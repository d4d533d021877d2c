# Device call (#9): the persistent forward with a dynamic tile scheduler (tmap claims work tiles from a counter):
# its tests (tmap, bitwise against tma, two streams), then same-run A/B tma vs tmap (fwd_variant_ab, cuDNN beside),
# bfloat16 1K-16K and float16 2K-4K.
#   CUFLASH_COMMIT=<head> bash experiments/scratch/tmap_dyn_call.sh   (carry [".kc"])
. experiments/scratch/_call_env.sh
export PATH=/opt/torch/.venv/bin:$PATH
timeout 200 python -m pytest tests/test_attention_sm90.py -q -x -n 15 -p no:cacheprovider \
  -k "tmap or persistent or every_configuration" 2>&1 | tail -3 | cut -c1-400
timeout 120 python experiments/scratch/fwd_variant_ab.py --a tma --b tmap --seqlens 1024 2048 4096 8192 16384 \
  --name tmap_dyn_ab_bfloat16_${CUFLASH_COMMIT:-x} 2>&1 | tail -21
pack
timeout 60 python experiments/scratch/fwd_variant_ab.py --a tma --b tmap --seqlens 2048 4096 --dtype float16 \
  --name tmap_dyn_ab_float16_${CUFLASH_COMMIT:-x} 2>&1 | tail -9
pack
