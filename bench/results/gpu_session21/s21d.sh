# Session 21, start 4: 64-key splits for 128-dim heads (split_keys) against 128 at Llama-3-8B,
# alternated in one process (split_ab.py); GPU tests of the attention kernels and graphs
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 220 python3 bench/results/gpu_session21/split_ab.py --out $OUT/split_ab.json 2>&1 | grep -v Warn | grep "llama3-8b  \|copy band"
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 385 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_attention.py tests/kernels/test_triton_rope_attention.py tests/engine/test_cuda_graphs.py 2>&1 | tail -5 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
