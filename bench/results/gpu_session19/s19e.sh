export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
timeout 330 python3 bench/results/gpu_session19/probe2.py $OUT/probe3.json 2 gated_32_256_4_3,gated_32_256_4_2,gated_64_128_4_3,gated_16_256_2_4,qkv_32_256_4_4,qkv_16_256_2_5,qkv_32_128_4_6,o_16_128_2_12,o_32_256_4_4 2>&1 | grep -v -i warn | tail -10
echo "probe $(( $(date +%s) - t0 )) s"
