# Session 33, call 1: the grid barrier's wait polled with loads in flight (triton_grid.poll_asm):
# the barrier alone (barrier_poll.py), its tests, the stack's tests with it, and the engine's
# batch-1 step per poll setting (step_ab.py, 3 rounds). barrier_poll.py's variants then: triton, r1,
# a1, r2_200, r4_100, r4_200, a4_100, r8_60 (call 2 swapped the last four for spun ones; the file
# now has both calls'); the stack's tuning33-35 then were r4, r4 serial, a1.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 bench/barrier_poll.py --out $OUT/barrier_poll.json 2>&1 | grep -v Warn
echo "barrier $(( $(date +%s) - t0 )) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short tests/kernels/test_triton_grid.py 2>&1 | tail -3
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "tuning33 or tuning34 or tuning35" 2>&1 | tail -3
echo "tests $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 bench/step_ab.py --out $OUT/step_ab.json --rounds 3 \
  --variant 'r4={"poll": [4, 100, false]}' --variant 'a1={"poll": [1, 0, true]}' \
  --variant 'r2={"poll": [2, 200, false]}' 2>&1 | grep -v Warn | tail -5
echo "step_ab $(( $(date +%s) - t0 )) s"
