# Session 23, start 2: resident tiles (every load of a GEMM phase's tile in one round trip,
# the norm summed from the pieces' registers) and the residual/slot loads before the
# product, A/B against the session-22 stack, same bits; then the stack tests
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 280 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --out $OUT/ab_resident.json \
  --variant 'old={"resident": "", "early": false}' --variant 'early={"resident": ""}' \
  --variant 'C={"resident": "C"}' --variant 'CD={"resident": "CD"}' 2>&1 | grep -v Warn | grep -v "^  [a-z_]* *critical" 
echo "ab $(( $(date +%s) - t0 )) s"
timeout 250 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x \
  tests/kernels/test_triton_decode_stack.py -k "equals_the_layers" 2>&1 | tail -8 | tee $OUT/tests.log
echo "all $(( $(date +%s) - t0 )) s"
