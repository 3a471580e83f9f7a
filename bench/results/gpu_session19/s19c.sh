export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
timeout 280 python3 bench/results/gpu_session19/qkv_rope_probe.py $OUT/qkv_rope_probe.json 6 2>&1 | grep -v -i warn | tail -10
echo "probe $(( $(date +%s) - t0 )) s"
