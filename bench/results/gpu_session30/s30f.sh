# Session 30, start 6: with 128-key blocks and the unpipelined key loop, keys and values a
# block ahead (att_prefetch 2: 32 / 160 B spilled serial / spread against 48 / 0) against
# the block ids only (1), same bits; batch 1 end to end, alternated, two rounds.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 100 python3 bench/stack_profile.py --ctx 120 200 600 --rounds 2 --no-engine --out $OUT/ab_pf2.json \
  --variant 'pf2={"att_prefetch": 2}' 2>&1 | grep -v Warn | grep -E "summary|  (default|pf2) |!!"
echo "profile $(( $(date +%s) - t0 )) s"
for r in 1 2; do
for v in 2 1; do
  timeout 60 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t
t.TUNING['att_prefetch'] = $v
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_pf${v}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "att_prefetch=$v round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_pf${v}_$r/*.png
done
done
