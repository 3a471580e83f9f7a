export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
timeout 330 python3 bench/tile_sweep.py $OUT/tile_sweep_s18g.json llama3-8b --only residual --pairs 2 2>&1 | grep -v -i warn | tail -12
