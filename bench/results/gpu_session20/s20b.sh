# Session 20, start 1 (second call): the silu fix and the unrolled GEMM phases, A/B in one process
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 300 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --out $OUT/ab1.json \
  --variant 'static={"static": true}' --variant 'unroll9={"unroll": 9}' 2>&1 | grep -v Warn | tail -52
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x \
  tests/kernels/test_triton_decode_stack.py -k equals_the_layers tests/kernels/test_triton_fused.py 2>&1 | tail -6 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
