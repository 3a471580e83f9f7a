# Session 23, start 3: resident tiles removed; "early" (residual and slot loads before the
# product) on by default; K steps that divide K (bk_exact) and other K steps A/B, same bits;
# the stack tests at every tuning; the 135M throughput on the default
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 260 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --out $OUT/ab_ksteps.json \
  --variant 'old={"early": false}' --variant 'bk64={"bk_exact": true}' \
  --variant 'bk64s6={"bk_exact": true, "num_stages": 6}' --variant 'bk128={"bk": 128, "bk_gated": 128}' \
  2>&1 | grep -v Warn | grep -v "^  [a-z_]* *critical" | grep -v "^\[" 
echo "ab $(( $(date +%s) - t0 )) s"
timeout 100 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp 2>&1 | grep -v Warn | tail -4
echo "tp $(( $(date +%s) - t0 )) s"
timeout 220 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x \
  tests/kernels/test_triton_decode_stack.py -k "equals_the_layers" 2>&1 | tail -8 | tee $OUT/tests.log
echo "all $(( $(date +%s) - t0 )) s"
