export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
timeout 400 python3 bench/tile_sweep.py $OUT/tile_sweep_k.json llama3-8b --only residual --pairs 2 2>&1 | grep -v -i warn | tail -20
