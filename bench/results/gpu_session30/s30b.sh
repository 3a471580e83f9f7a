# Session 30, start 2: the GPU tests with a split as one key block (BLOCK_N 128): the
# attention kernels against the float64 reference and their invariance, the rope +
# attention launch, the graphs, and the stack against the layers (bits).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
T="python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short"
timeout 200 $T tests/kernels/test_triton_attention.py tests/kernels/test_triton_rope_attention.py tests/engine/test_cuda_graphs.py 2>&1 | tail -5
echo "attention + graphs $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) $T tests/kernels/test_triton_decode_stack.py 2>&1 | tail -8
echo "stack $(( $(date +%s) - t0 )) s"
