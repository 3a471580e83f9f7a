export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x tests/kernels/test_triton_fused.py -k "qkv_rope or whole_model or wide_model" 2>&1 | tail -15 | tee $OUT/tests_a.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout $(( 450 - $(date +%s) + t0 )) python3 bench/pdl_trigger_ab.py $OUT/qkv_rope_ab.json llama3-8b --only qkv_rope_off --pairs 5 2>&1 | grep -v Warn | tail -6
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 580 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/bench/test_throughput.py tests/engine/test_cuda_graphs.py 2>&1 | tail -8 | tee $OUT/tests_b.log
echo "tests_b $(( $(date +%s) - t0 )) s"
