export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
timeout 280 python3 bench/results/gpu_session19/probe2.py $OUT/probe2.json 4 spread,split64,gated,gated_32_256_4_3,gated_32_128_4_4 2>&1 | grep -v -i warn | tail -10
echo "probe $(( $(date +%s) - t0 )) s"
