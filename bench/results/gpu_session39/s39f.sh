# Session 39 (carry [".whl"]): the head's new default tile (Q8_TILE 16x256x32, 4 warps, 6
# stages): its GPU tests (q8_linear against the half weight's GEMM at rows 1-16, the graphs
# with the blocks against the bf16 head; the old default kept among the tested tiles), then
# both heads alone per tile (Gemma-3-270M's 262,144 x 640 never timed).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short -n 8 \
  tests/kernels/test_triton_matmul.py tests/kernels/test_q8.py tests/engine/test_cuda_graphs.py \
  -k "not default_model" 2>&1 | tail -4
echo "tests $(( $(date +%s) - t0 )) s"
timeout 150 python3 bench/lm_head_q8.py --shapes 49152x576 262144x640 --out $OUT/lm_head_q8.json \
  --rounds 3 --tiles 16x128x32x4x8 16x256x32x4x6 16x128x32x2x8 2>&1 | grep -v Warn | tail -8
echo "head $(( $(date +%s) - t0 )) s"
