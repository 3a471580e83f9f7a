# Session 33, call 3: the barrier's counter on a line of its own (phase B's merge counts shared
# its line: the 512-612 graph, the spread one, read +21 to +29 us with the faster waits),
# with the default wait and with the single relaxed / acquire load (step_ab.py, 3 rounds);
# the stack's tests with the relaxed wait and the counter's own line. (TUNING["counter_line"]
# was removed after this call: it changed nothing.)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 400 python3 bench/step_ab.py --out $OUT/step_ab.json --rounds 3 \
  --variant 'cl={"counter_line": true}' --variant 'r1cl={"poll": [1, 0, false], "counter_line": true}' \
  --variant 'a1cl={"poll": [1, 0, true], "counter_line": true}' 2>&1 | grep -v Warn | tail -5
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "tuning36 or tuning35" 2>&1 | tail -3
echo "tests $(( $(date +%s) - t0 )) s"
