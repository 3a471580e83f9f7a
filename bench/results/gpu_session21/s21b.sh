# Session 21, start 2: the attention phase's rotated queries kept in registers (q_regs: no
# store and L2 reload), and 128-key attention blocks (att_bn: changes the bits, speed only
# here); GPU tests of the stack and the rope+attention kernel
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 300 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab2.json \
  --variant 'qregs={"q_regs": true}' --variant 'bn128={"att_bn": 128}' \
  --variant 'qregs_bn128={"q_regs": true, "att_bn": 128}' 2>&1 | grep -v Warn | grep -A 30 summary
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 570 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py tests/kernels/test_triton_rope_attention.py 2>&1 | tail -5 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
