# Session 29, start 2: the merge in phase C's operand in registers (fold_pairs + tl.gather in
# the o product's K loop; every split state left by phase B, the lone split's too; the
# pairs' metadata found once a launch): the phase table at 120 / 200 / 250 cached tokens
# against the default (the engine's serial graph at <= 256 keys), with 128- and 64-key
# splits, and 64-key splits merged in phase B; then the stack's GPU tests.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 300 python3 bench/stack_profile.py --ctx 120 200 250 --rounds 2 --no-engine --out $OUT/ab_fold.json \
  --variant 'spread={"_serial": 0}' \
  --variant 's64={"_serial": 0, "_split": 64}' \
  --variant 's64_b={"_serial": 0, "_split": 64, "merge_in_o": false}' 2>&1 | grep -v Warn | grep -E "^\[|summary|  (default|spread|s64)|attention|  o  |!!"
echo "profile $(( $(date +%s) - t0 )) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "fold_pairs or smollm2_widths or long_context or several or verify or padding or tuning18 or tuning19 or 3-None" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
