# Session 36, call 1 (carry [".whl", ".carry/smol.part00"]): session 35's unrun Q8_0 head
# check, then the o product by kv-head group (phase C inside phase B at batch 1, "o_fuse").
# Copies the GGUF's first half to /tmp for s35d.sh, which can run right after.
# 1. GPU tests: the Q8_0 head's bits against the bf16 GEMM (kWidth fix, commit 65f71e2);
#    the segmented o product's row bits over row counts and tiles; the stack against the
#    layers with the o product by group (tiny model: fused, unfused, spread; the whole
#    SmolLM2-135M shape over 128 steps, serial kernel).
# 2. step_ab.py --q8-head at 129-228 cached tokens: default against og (o_groups, fused: a
#    tile's last item sums the chains), og2 (phase D sums them), og_c (o_groups, phase C on
#    its own) and noc (the probe: phase C skipped, wrong bits).
export PYTHONUNBUFFERED=1
cp .carry/smol.part00 /tmp/smol.part00 && ls -l /tmp/smol.part00
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=line \
  tests/kernels/test_triton_matmul.py tests/kernels/test_q8.py tests/engine/test_cuda_graphs.py \
  -k "q8 and not default_model" 2>&1 | tail -6
echo "q8 tests $(( $(date +%s) - t0 )) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_fused.py tests/kernels/test_triton_decode_stack.py \
  -k "segments or o_product or real_models_steps" 2>&1 | tail -8
echo "o tests $(( $(date +%s) - t0 )) s"
timeout $(( 580 - $(date +%s) + t0 )) python3 bench/step_ab.py --q8-head --out $OUT/step_ab_og.json \
  --rounds 3 --starts 128 --variant 'og={"o_groups": true}' \
  --variant 'og2={"o_groups": true, "o_fuse": 2}' \
  --variant 'og_c={"o_groups": true, "o_fuse": 0}' --variant 'noc={"no_c": 1}' 2>&1 \
  | grep -v Warn | tail -7
echo "step_ab $(( $(date +%s) - t0 )) s"
