# Session 31, start 1: the five settings built in session 30 and never run on a GPU, each
# alone and together, against the default (stack replay at 120 / 200 / 600 cached tokens,
# outputs compared bit for bit); then the stack's GPU tests for those tunings against the
# layers, and the default's long-context / several-sequence / verify / SmolLM2-width tests
# (the session-30 refactor of the attention's split arithmetic has not run on a GPU).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 330 python3 bench/stack_profile.py --ctx 120 200 600 --rounds 2 --no-engine --out $OUT/ab_new.json \
  --variant 'h2={"att_hoist": 2}' --variant 'kt={"k_t": true}' \
  --variant 'late={"late_rstd": true}' --variant 'qh={"qkv_hoist": true}' \
  --variant 'vl1={"v_l1": true}' \
  --variant 'all={"att_hoist": 2, "k_t": true, "late_rstd": true, "qkv_hoist": true}' \
  > $OUT/profile.log 2>&1
echo "profile rc $? $(( $(date +%s) - t0 )) s"
grep -E "summary|  [a-z0-9]+ +ctx|!!|Error|error" $OUT/profile.log | grep -v Warn | head -40
timeout $(( 580 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_decode_stack.py \
  -k "(equals_the_layers and (tuning22 or tuning23 or tuning24 or tuning25 or tuning26 or tuning27 or tuning28 or tuning29 or tuning30 or tuning31 or tuning32 or tuning33)) or long_context or several or verify_blocks" 2>&1 | tail -8
echo "tests $(( $(date +%s) - t0 )) s"
