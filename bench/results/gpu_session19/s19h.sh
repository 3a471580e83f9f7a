export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
for i in 1 2; do
timeout $(( 150 * i - $(date +%s) + t0 )) python3 bench/throughput.py --models llama3-8b --batch-sizes 1 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp_repeat$i > $OUT/tp_repeat$i.log 2>&1
grep -v -i warn $OUT/tp_repeat$i.log | tail -3
echo "run $i $(( $(date +%s) - t0 )) s"
done
