# Session 20 (fourth call): the barrier's arrivals over several counters (microbench, then
# the stack), gate+up in one product as default; GPU tests
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 120 python3 bench/grid_barrier.py --rounds 2000 --slots 1 4 8 16 --out $OUT/grid_barrier.json 2>&1 | grep -v Warn | grep "'barrier'\|us_per_barrier" | cut -c1-160
echo "barrier $(( $(date +%s) - t0 )) s"
timeout 240 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab3.json \
  --variant 'slots4={"barrier_slots": 4}' --variant 'slots8={"barrier_slots": 8}' \
  --variant 'slots16={"barrier_slots": 16}' 2>&1 | grep -v Warn | grep -A 30 summary
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "equals_the_layers" 2>&1 | tail -4 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
