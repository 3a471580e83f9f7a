# Session 22, start 4: rope + cache write in the stack's QKV phase by default (qkv_rope),
# q_regs removed: GPU tests (the stack at every tuning, the whole 135M shape over 128
# steps in both rope modes, rope + attention, the fused kernels, CUDA graphs), the
# stack against the layers over 160 steps with batch 64, then the throughput command
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py tests/kernels/test_triton_rope_attention.py tests/kernels/test_triton_fused.py \
  tests/engine/test_cuda_graphs.py 2>&1 | tail -8 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/stack_vs_layers.py --steps 160 --out $OUT/svl.json 2>&1 | grep -v Warn | tail -3
echo "svl $(( $(date +%s) - t0 )) s"
timeout 150 python3 bench/throughput.py --models llama3-8b smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp 2>&1 | grep -v Warn | tail -9
python3 -c "import json; d=json.load(open('$OUT/tp/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
echo "all $(( $(date +%s) - t0 )) s"
