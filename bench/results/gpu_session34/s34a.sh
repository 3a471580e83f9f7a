# Prepared in session 34, NOT RUN: no device machine was lent in that session. The next
# session's first call for the Q8_0 LM head (kernels/q8.py, triton_matmul.q8_linear); carry
# [".whl"]. Under 10 minutes (each step has its timeout); s34c.sh has the rest.
# 1. its GPU tests: q8_linear's bits against the bf16 weight's GEMM at its own tiles (rows
#    1-16, bf16 and fp16, three widths), _q8_dequant over every fp16 scale and int8 value,
#    logits_linear's switch, the decode graphs with the blocks against the bf16 head (the
#    real-model tests need the GGUF: s34b.sh);
# 2. the engine's batch-1 step with the random LM head as Q8_0 blocks, read as blocks
#    against the bf16 weight, and with its programs asking L2 for all 18 of their blocks
#    before waiting on the final norm (Q8_EARLY; step_ab.py --q8-head, 3 alternated rounds,
#    tokens compared);
# 3. throughput.py batch 1 with --q8-head, invariant against bf16head (s34c.sh: again);
# 4. the head alone per tile, each call on its own weight copy (bench/lm_head_q8.py):
#    SmolLM2-135M's vocabulary (49,152 x 576) and Gemma-3-270M's (262,144 x 640), 1 row.
# Prediction (bench/NOTES.md, session 34): the head 16.8 -> ~9.5-10.5 us alone; the step
# -6 to -8 us at both contexts; batch 1 ~+1.2-1.5 %.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_matmul.py tests/kernels/test_q8.py tests/engine/test_cuda_graphs.py \
  -k "not default_model" 2>&1 | tail -5
echo "tests $(( $(date +%s) - t0 )) s"
timeout 200 python3 bench/step_ab.py --q8-head --out $OUT/step_ab_q8.json --rounds 3 \
  --variant 'bf16head={"q8_head": false}' --variant 'early18={"q8_early": 18}' 2>&1 \
  | grep -v Warn | tail -4
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout 100 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 \
  --no-hf --q8-head --variants invariant bf16head --prefill-len 256 --out-dir $OUT/tp_q8_1 \
  2>&1 | grep -v Warn | grep -E "invariant|bf16head|row 0" | tail -3
rm -f $OUT/tp_q8_1/*.png
echo "tp $(( $(date +%s) - t0 )) s"
timeout $(( 580 - $(date +%s) + t0 )) python3 bench/lm_head_q8.py --out $OUT/lm_head_q8.json \
  --rounds 3 2>&1 | grep -v Warn | tail -16
echo "head $(( $(date +%s) - t0 )) s"
