# Session 32, call 5: the stack launched by PDL (TUNING["pdl"]: the input kernel lets it
# launch at once; its prologue's metadata loads and layer 0's prefetch overlap the input
# kernel, then it waits) against off, in the engine's batch-1 step (step_ab.py, 3 rounds);
# throughput.py at the new default; the step's trace; the stack's GPU tests (every test
# but the other tunings', and the pdl-off entry) and the graphs'.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 bench/step_ab.py --out $OUT/step_ab.json --rounds 3 \
  --variant 'nopdl={"pdl": false}' 2>&1 | grep -v Warn | tail -3
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout 80 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 --no-hf \
  --variants invariant --prefill-len 256 --out-dir $OUT/tp 2>&1 | grep -v Warn | grep invariant | tail -1
rm -f $OUT/tp/*.png
timeout 80 python3 bench/step_trace.py --steps 40 --out $OUT/step_trace.json 2>&1 | grep -v Warn | tail -12
rm -f $OUT/step_trace.json.chrome.json
echo "trace $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_decode_stack.py tests/engine/test_cuda_graphs.py -k "not tuning or tuning34" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
