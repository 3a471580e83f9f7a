# Session 31, start 3: the new default (qkv_hoist on) against the old (off), throughput.py's
# batch 1 alternated, two rounds; then the stack's GPU tests at the new default (every test
# of the file but the other tunings').
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
for r in 1 2; do
for v in new old; do
  timeout 70 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t
if '$v' == 'old':
    t.TUNING['qkv_hoist'] = False
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${v}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | tail -1
  echo "$v round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
timeout $(( 420 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "not tuning" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
