# Session 29, start 3: SmolLM2-135M batch 1 end to end at HEAD (e0cdd87 + stack_profile's
# switches), session 28's kept setting (the GEMM phases' K loops at 5 stages) against the
# kernel's 4, alternated, three rounds (session 28 had time for one).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
for r in 1 2 3; do
for v in 5 0; do
  timeout 100 python3 -c "
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
