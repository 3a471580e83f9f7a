export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 330 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_decode_stack.py tests/engine/test_graph_inputs.py 2>&1 | tail -8 | tee $OUT/tests_g1.log
echo "stack $(( $(date +%s) - t0 )) s"
timeout $(( 470 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/engine/test_async_scheduling.py tests/kernels/test_fp8_kv.py 2>&1 | tail -6 | tee $OUT/tests_g2.log
echo "async $(( $(date +%s) - t0 )) s"
