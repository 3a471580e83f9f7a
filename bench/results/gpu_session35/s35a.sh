# Session 35, call 1 (carry [".whl"]): the GPU checks and A/Bs that sessions 33-34 could not run,
# in one call (device time: two machine starts were refused before it).
# 1. GPU tests: the grid barrier's waits, the stack against the layers at the relaxed-wait
#    default, the decode graphs (bf16 head and the Q8_0 head), q8_linear's bits against the
#    bf16 GEMM at its own tiles, _q8_dequant over every fp16 scale and int8 value.
# 2. step_ab.py --q8-head: the default (relaxed wait + Q8_0 head) against the bf16 head and
#    against the acquire wait (session 33's A/B, now beside the new head), 3 alternated rounds.
# 3. throughput.py batch 1 --q8-head: invariant (blocks) against bf16head, the random shape.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 270 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_grid.py tests/kernels/test_triton_matmul.py tests/kernels/test_q8.py \
  tests/engine/test_cuda_graphs.py tests/kernels/test_triton_decode_stack.py \
  -k "not default_model and (not tuning or tuning33 or tuning34 or tuning35 or tuning36)" 2>&1 | tail -8
echo "tests $(( $(date +%s) - t0 )) s"
timeout 200 python3 bench/step_ab.py --q8-head --out $OUT/step_ab_q8.json --rounds 3 \
  --variant 'bf16head={"q8_head": false}' --variant 'acq={"poll": null}' 2>&1 \
  | grep -v Warn | tail -5
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout $(( 585 - $(date +%s) + t0 )) python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 \
  --no-hf --q8-head --variants invariant bf16head --prefill-len 256 --out-dir $OUT/tp_q8_1 \
  2>&1 | grep -v Warn | grep -E "invariant|bf16head|row 0" | tail -3
rm -f $OUT/tp_q8_1/*.png
echo "tp $(( $(date +%s) - t0 )) s"
