# Session 30, start 4: the attention loop's pipeline depth in the stack with 128-key blocks
# (TUNING["att_stages"]; None: the kernel's 4 stages, 102 kB shared, 84 / 140 B spilled
# serial / spread; 1: 64 kB, 48 / 0 B), same bits; then batch 1 end to end, 1 against None.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 300 python3 bench/stack_profile.py --ctx 120 200 600 --rounds 2 --no-engine --out $OUT/ab_att_stages.json \
  --variant 'st1={"att_stages": 1}' \
  --variant 'st2={"att_stages": 2}' \
  --variant 'st3={"att_stages": 3}' 2>&1 | grep -v Warn | grep -E "summary|  (default|st1|st2|st3) |!!"
echo "profile $(( $(date +%s) - t0 )) s"
for r in 1 2; do
for v in 1 0; do
  timeout 110 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t
t.TUNING['att_stages'] = $v or None
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_st${v}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "att_stages=$v round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_st${v}_$r/*.png
done
done
