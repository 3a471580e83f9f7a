# Session 23, start 4: the committed defaults (early loads, K steps that divide K): the 135M
# throughput twice, the stack against the session-22 settings, then the GPU tests
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
for i in 1 2; do
timeout 80 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp$i 2>&1 | grep -v Warn | tail -3
python3 -c "import json; d=json.load(open('$OUT/tp$i/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
rm -f $OUT/tp$i/*.png
done
echo "tp $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab_final.json \
  --variant 's22={"early": false, "bk_exact": false}' --variant 'early_only={"bk_exact": false}' \
  2>&1 | grep -v Warn | grep -v "^  [a-z_]* *critical" | grep -v "^\["
echo "ab $(( $(date +%s) - t0 )) s"
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py 2>&1 | tail -6 | tee $OUT/tests_stack.log
echo "stack tests $(( $(date +%s) - t0 )) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_fused.py tests/engine/test_cuda_graphs.py 2>&1 | tail -6 | tee $OUT/tests_fused.log
echo "all $(( $(date +%s) - t0 )) s"
