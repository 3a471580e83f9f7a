# Session 35, call 3 (carry [".whl", ".carry/smol.part00"]): the Q8_0 head with the identity-asm
# boundary (kWidth 2: the bf16 GEMM's k16 groups; s35a's tests had its bits off). Copies the
# GGUF's first half to /tmp for s34b.sh, run right after.
# 1. GPU tests: q8_linear's bits against the bf16 GEMM, logits_linear's switch, the decode graphs
#    with the blocks against the bf16 head, _q8_dequant, Q8_EARLY.
# 2. throughput.py batch 1 --q8-head: invariant (blocks) against bf16head.
# (step_ab and the real model: s35d.sh; the budget after four refused starts.)
export PYTHONUNBUFFERED=1
cp .carry/smol.part00 /tmp/smol.part00 && ls -l /tmp/smol.part00
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=line \
  tests/kernels/test_triton_matmul.py tests/kernels/test_q8.py tests/engine/test_cuda_graphs.py \
  -k "q8 and not default_model" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
timeout 100 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 \
  --no-hf --q8-head --variants invariant bf16head --prefill-len 256 --out-dir $OUT/tp_q8 \
  2>&1 | grep -v Warn | grep -E "invariant|bf16head|row 0" | tail -3
rm -f $OUT/tp_q8/*.png
echo "tp $(( $(date +%s) - t0 )) s"
