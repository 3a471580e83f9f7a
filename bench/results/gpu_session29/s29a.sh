# Session 29, start 1: phase B's spread groups leave their split states to phase C
# (TUNING["merge_in_o"]): the stack's tests on the GPU (bits against the layers, the merge
# against phase B's), then the phase table at 120 / 200 / 250 cached tokens: the default
# (the engine's serial graph at <= 256 keys), the spread kernel with the merge in C, without
# it, and 64-key splits (spread, merge in C; other bits).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "merge_pairs or smollm2_widths or long_context or several or verify or tuning18 or tuning19 or 1-None or 3-None or None-None" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
timeout 330 python3 bench/stack_profile.py --ctx 120 200 250 --rounds 2 --no-engine --out $OUT/ab_merge.json \
  --variant 'spread={"_serial": 0}' \
  --variant 'spread_b={"_serial": 0, "merge_in_o": false}' \
  --variant 's64={"_serial": 0, "_split": 64}' 2>&1 | grep -v Warn | grep -E "^\[|summary|  (default|spread|s64)|attention|  o  |!!"
echo "profile $(( $(date +%s) - t0 )) s"
