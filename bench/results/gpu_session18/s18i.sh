export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
timeout 100 python3 bench/throughput.py --models llama3-8b --batch-sizes 1 64 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp > $OUT/tp.log 2>&1
tail -4 $OUT/tp.log
echo "tp $(( $(date +%s) - t0 )) s"
timeout $(( 200 - $(date +%s) + t0 )) python3 bench/tile_sweep.py $OUT/tile_sweep_final2.json llama3-8b --only combos --pairs 3 2>&1 | grep -v -i warn | tail -4
