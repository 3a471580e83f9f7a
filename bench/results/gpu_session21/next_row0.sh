# For the next session (not run in session 21: device time spent): the one-step row-0
# divergence between SmolLM2-135M batch 1 (stack) and 64 (layered) in throughput_final.json.
# Carry .whl (gguf) as in s21a.sh; ~5-6 min on a warm H200.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_decode_stack.py \
  -k "smollm2_widths" 2>&1 | tail -4 | tee $OUT/tests.log
timeout 200 python3 bench/stack_vs_layers.py --steps 160 --out $OUT/svl.json 2>&1 | grep -v Warn | tail -12
echo "svl $(( $(date +%s) - t0 )) s"
for i in 1 2; do
  timeout 120 python3 bench/throughput.py --models llama3-8b smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp$i 2>&1 | grep -v Warn | tail -9
  python3 -c "import json; d=json.load(open('$OUT/tp$i/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
done
echo "all $(( $(date +%s) - t0 )) s"
