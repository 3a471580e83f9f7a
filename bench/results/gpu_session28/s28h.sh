# Session 28, start 8: the GEMM phases' K loops at 5 stages kept (TUNING["gemm_stages"]):
# the stack against the layers at the new tunings and the real SmolLM2 widths, then
# SmolLM2-135M batch 1 end to end with and without it, alternated (one round: the device time left).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_decode_stack.py \
  -k "tuning18 or tuning19 or 1-None or smollm2_widths" 2>&1 | tail -3
echo "tests $(( $(date +%s) - t0 )) s"
for r in 1; do
for v in 5 0; do
  timeout 70 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t
t.TUNING['gemm_stages'] = $v or None
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${v}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "gemm_stages=$v round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
