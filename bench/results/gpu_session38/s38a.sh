# Session 38 (carry [".whl"]): the decode stack's whole GPU test file (session 37 cut it at
# 300 s with 45 passed and none failed), in 8 pytest-xdist workers (the Triton compiles
# are CPU-bound; the box has 16 cores). With the release-word barrier's rows.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 560 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short -n 8 --durations=25 \
  tests/kernels/test_triton_decode_stack.py -k "not o_product and not default_model" \
  > $OUT/stack_tests.txt 2>&1
echo "rc $?"
grep -E "passed|failed|FAILED|Error" $OUT/stack_tests.txt | tail -30
echo "tests $(( $(date +%s) - t0 )) s"
