# Session 20 (third call): the one-round norm as default; gate+up in one product, the
# attention's key prefetch modes and 5 stages as variants; GPU tests of this code
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 330 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab2.json \
  --variant 'one_dot={"gated_one_dot": true}' --variant 'att0={"att_prefetch": 0}' \
  --variant 'att2={"att_prefetch": 2}' --variant 'stages5={"num_stages": 5}' 2>&1 | grep -v Warn | grep -A 30 summary
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py tests/kernels/test_triton_fused.py -k "equals_the_layers or gated or silu or whole_model or wide_model" 2>&1 | tail -6 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
