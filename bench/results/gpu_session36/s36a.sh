# Session 36, call 1 (carry [".whl", ".carry/smol.part00"]): session 35's unrun Q8_0 head
# check, then the o product by kv-head group (phase C inside phase B at batch 1, "o_fuse").
# Copies the GGUF's first half to /tmp for s36c.sh.
# 1. GPU tests: the Q8_0 head's bits against the bf16 GEMM (kWidth fix, commit 65f71e2);
#    the segmented o product's row bits over row counts and tiles; the stack against the
#    layers with the o product by group (tiny model: fused, unfused, spread; the whole
#    SmolLM2-135M shape over 128 steps, serial kernel).
# (step_ab: s36b.sh, right after; the real model: s36c.sh.)
export PYTHONUNBUFFERED=1
cp .carry/smol.part00 /tmp/smol.part00 && ls -l /tmp/smol.part00
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=line \
  tests/kernels/test_triton_matmul.py tests/kernels/test_q8.py tests/engine/test_cuda_graphs.py \
  -k "q8 and not default_model" 2>&1 | tail -6
echo "q8 tests $(( $(date +%s) - t0 )) s"
timeout 420 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_fused.py tests/kernels/test_triton_decode_stack.py tests/engine/test_cuda_graphs.py \
  -k "segments or o_product or real_models_steps or serial_split" 2>&1 | tail -8
echo "o tests $(( $(date +%s) - t0 )) s"
