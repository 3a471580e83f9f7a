# Session 22, start 3: the in-register queries rebuilt from loads (rotated_rows) against
# queries through L2, and rope + cache write in the QKV phase's epilogue (qkv_rope); then
# the GPU tests of the stack (every tuning, the whole 135M shape over 128 steps for each
# rope mode) and of rope + attention
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
timeout 240 python3 bench/stack_profile.py --ctx 120 250 600 --rounds 2 --no-engine --out $OUT/ab_rope.json \
  --variant 'qregs_off={"q_regs": false}' --variant 'qkv_rope={"qkv_rope": true}' 2>&1 | grep -v Warn | grep -A 30 summary
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py tests/kernels/test_triton_rope_attention.py tests/kernels/test_triton_fused.py 2>&1 | tail -8 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
