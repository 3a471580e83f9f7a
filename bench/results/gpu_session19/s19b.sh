export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
timeout 200 python3 bench/chain_profile.py $OUT/chain_qkv_rope.json llama3-8b --only qkv_rope_off 2>&1 | grep -v Warn | tail -34
echo "chain $(( $(date +%s) - t0 )) s"
