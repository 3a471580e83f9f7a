# Session 25, start 3: the argmax's first pass in the lm_head GEMM's epilogue
# (linear.logits_argmax): its GPU tests, both shapes end to end with the session's final
# code, then fused against apart in one process
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_argmax.py \
  tests/engine/test_cuda_graphs.py 2>&1 | tail -4 | tee $OUT/tests_argmax.log
grep -q " passed" $OUT/tests_argmax.log && ! grep -q "failed" $OUT/tests_argmax.log || export MMSERVE_FUSED_ARGMAX=0
echo "tests $(( $(date +%s) - t0 )) s; fused argmax ${MMSERVE_FUSED_ARGMAX:-1}"
timeout 170 python3 bench/throughput.py --models smollm2-135m llama3-8b --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp 2>&1 | grep -v Warn | tail -9
python3 -c "import json; d=json.load(open('$OUT/tp/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
rm -f $OUT/tp/*.png
echo "tp $(( $(date +%s) - t0 )) s"
timeout $(( 320 - $(date +%s) + t0 )) python3 bench/copy_ab.py --switch argmax --rounds 4 --out $OUT/argmax_ab.json 2>&1 | grep -v Warn | tail -10
echo "all $(( $(date +%s) - t0 )) s"
