# Session 27, start 4: the final code's GPU tests: the stack against the layers (every
# test of the file), then the fused kernels' bit tests in the time left.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 250 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_decode_stack.py 2>&1 | tail -4 | tee $OUT/tests_stack.log
echo "stack tests $(( $(date +%s) - t0 )) s"
timeout $(( 300 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_fused.py -k "row_bits or pairwise or matches_composition" 2>&1 | tail -4 | tee $OUT/tests_fused.log
echo "all $(( $(date +%s) - t0 )) s"
