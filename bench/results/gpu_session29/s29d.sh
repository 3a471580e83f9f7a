# Session 29, start 4: the LM head's first MB asked into L2 by the stack's prefetching
# programs during the last layers' attention phases (TUNING["tail_mb"], ["tail_layers"]):
# SmolLM2-135M batch 1 end to end, the default (20 MB over the last 2 layers) against none
# and 30 MB over 3, alternated, two rounds (row 0's tokens compared across them); then the
# GPU test of greedy tokens with and without the stack.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
for r in 1 2; do
for v in "20,2" "0,0" "30,3"; do
  mb=${v%,*}; tl=${v#*,}
  timeout 100 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t
t.TUNING['tail_mb'] = $mb
t.TUNING['tail_layers'] = $tl
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${mb}_${tl}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "tail $mb MB over $tl layers, round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${mb}_${tl}_$r/*.png
done
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "greedy or None-None or smollm2_widths" 2>&1 | tail -3
echo "tests $(( $(date +%s) - t0 )) s"
