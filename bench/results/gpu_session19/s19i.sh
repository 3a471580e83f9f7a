export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
A="--models llama3-8b smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf --variants invariant"
timeout 150 python3 bench/results/gpu_session19/split64_tp.py $A --out-dir $OUT/tp_split64 > $OUT/tp_split64.log 2>&1
grep -v -i warn $OUT/tp_split64.log | grep -v "^\[" | tail -6
echo "split64 $(( $(date +%s) - t0 )) s"
timeout $(( 300 - $(date +%s) + t0 )) python3 bench/throughput.py $A --out-dir $OUT/tp_default > $OUT/tp_default.log 2>&1
grep -v -i warn $OUT/tp_default.log | grep -v "^\[" | tail -6
echo "default $(( $(date +%s) - t0 )) s"
