# Session 32, call 4: the engine's batch-1 step per stack setting on the new default
# (qkv_hoist on, the shorter tail): v_l1 2 (new: each key step asks L1 for the next one's
# keys and values, the ids two steps ahead), v_l1 1, att_hoist 2 and late_rstd (each
# measured in session 31 only against the old default); then the stack's GPU tests with
# v_l1 2 (the attention-heavy ones: long contexts, the SmolLM2 widths, verify blocks,
# several sequences, and the TUNINGS entries).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 330 python3 bench/step_ab.py --out $OUT/step_ab.json --rounds 3 \
  --variant 'vl2={"v_l1": 2}' --variant 'vl1={"v_l1": true}' \
  --variant 'ah2={"att_hoist": 2}' --variant 'lr={"late_rstd": true}' 2>&1 | grep -v Warn | tail -7
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -c "
import sys, pytest
from mmserve.kernels import triton_decode_stack as t
t.TUNING['v_l1'] = 2
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-o', 'addopts=', '--tb=short',
  'tests/kernels/test_triton_decode_stack.py', '-k',
  'long_context or smollm2_widths or verify_blocks or several_sequences or graph_padding or real_models or tuning34 or tuning35']))
" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
