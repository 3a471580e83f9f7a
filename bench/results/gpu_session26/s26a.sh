# Session 26, start 1: a row handed from one phase to the next by a grid barrier and a
# load, against tags carried in the data (bench/handoff.py); the barrier alone for scale.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 200 python3 bench/handoff.py --rounds 2000 --out $OUT/handoff.json 2>&1 | grep -v Warn | tail -30
echo "handoff $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/grid_barrier.py --rounds 2000 --out $OUT/grid_barrier.json 2>&1 | grep -v Warn | tail -12
echo "all $(( $(date +%s) - t0 )) s"
