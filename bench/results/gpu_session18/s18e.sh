export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
timeout 300 python3 bench/pdl_trigger_ab.py $OUT/gated_ahead_ab.json llama3-8b --pairs 3 --only gated,gated_down_ahead_1024,gated_down_ahead_2048,gated_down_ahead_4096 2>&1 | grep -v -i warn | tail -8
timeout 200 python3 bench/chain_profile.py $OUT/chain_gated.json llama3-8b --only gated,gated_down_ahead_2048 2>&1 | grep -v -i warn | grep -v "kernels a step" | tail -40
