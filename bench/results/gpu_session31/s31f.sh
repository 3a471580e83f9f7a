# Session 31, start 3 (second call): the two winners of call 5 (qkv_hoist, att_hoist 1) alone
# and together against the default, the engine's step (s31e.py, rounds alternately in
# reverse order); then throughput.py's batch 1 for each, alternated.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
SETTINGS='default={};qh={"qkv_hoist": true};h1={"att_hoist": 1};qh1={"qkv_hoist": true, "att_hoist": 1}' \
  timeout 200 python3 bench/results/gpu_session31/s31e.py 2>&1 | grep -v Warn | tail -5
echo "engine $(( $(date +%s) - t0 )) s"
for v in qh1 old qh; do
  timeout 80 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t
if '$v' == 'qh1':
    t.TUNING.update(qkv_hoist=True, att_hoist=1)
if '$v' == 'qh':
    t.TUNING.update(qkv_hoist=True)
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${v}']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | tail -1
  echo "$v $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}/*.png
done
