export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python3 bench/pdl_trigger_ab.py $OUT/ahead_ab.json llama3-8b --only o_ahead_4096,o_ahead_2048,o_ahead_1024,down_ahead_1024,gate_up_ahead_512,qkv_ahead_512,ahead_all 2>&1 | grep -v Warn | tail -12
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_attention.py tests/kernels/test_fp8_kv.py tests/engine/test_cuda_graphs.py tests/engine/test_graph_inputs.py 2>&1 | tail -12 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
