# Session 31, start 1 (second call): the settings that won alone in call 1 (k_t, qkv_hoist,
# att_hoist 1 / 2), together, against the default (stack replay at 120 / 200 / 600);
# then batch-1 end to end, the best three on (new) against the committed default (old),
# alternated, two rounds.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 200 python3 bench/stack_profile.py --ctx 120 200 600 --rounds 2 --no-engine --out $OUT/ab_best.json \
  --variant 'kq={"k_t": true, "qkv_hoist": true}' \
  --variant 'kqh1={"k_t": true, "qkv_hoist": true, "att_hoist": 1}' \
  --variant 'kqh2={"k_t": true, "qkv_hoist": true, "att_hoist": 2}' \
  > $OUT/profile.log 2>&1
echo "profile rc $? $(( $(date +%s) - t0 )) s"
grep -E "summary|  [a-z0-9]+ +ctx|!!|Error|error" $OUT/profile.log | grep -v Warn | head -20
for r in 1 2; do
for v in new old; do
  timeout 90 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t
if '$v' == 'new':
    t.TUNING.update(k_t=True, qkv_hoist=True, att_hoist=2)
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${v}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "$v round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
