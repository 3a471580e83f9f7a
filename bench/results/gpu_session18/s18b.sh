export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
timeout 300 python3 bench/chain_profile.py $OUT/chain_profile.json llama3-8b --only o_ahead_4096 2>&1 | grep -v Warn | tail -40
