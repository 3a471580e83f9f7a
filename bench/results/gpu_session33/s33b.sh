# Session 33, call 2: the barrier's wait with fewer loads on the counter's line (a spin before
# each load is issued again), the barrier alone; then the engine's batch-1 step with the
# single relaxed load and its spun form (step_ab.py, 3 rounds), a1 again.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 bench/barrier_poll.py --out $OUT/barrier_poll.json 2>&1 | grep -v Warn
echo "barrier $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 bench/step_ab.py --out $OUT/step_ab.json --rounds 3 \
  --variant 'r1={"poll": [1, 0, false]}' --variant 'r1g={"poll": [1, 0, false, 150]}' \
  --variant 'a1={"poll": [1, 0, true]}' 2>&1 | grep -v Warn | tail -5
echo "step_ab $(( $(date +%s) - t0 )) s"
