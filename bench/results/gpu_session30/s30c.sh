# Session 30, start 3: the stack at 200 / 250 / 600 cached tokens (600: the spread kernel,
# 140 B spilled with 128-key blocks) with 128-key blocks (default) against 64-key blocks,
# 256-key splits of 128-key blocks, and 256-key splits as one block (other bits each); then
# batch 1 end to end, 128 against 64, alternated, two more rounds.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 280 python3 bench/stack_profile.py --ctx 200 250 600 --rounds 2 --no-engine --out $OUT/ab_bn2.json \
  --variant 'bn64={"_bn": 64}' \
  --variant 's256={"_split": 256}' \
  --variant 'b256={"_bn": 256, "_split": 256}' 2>&1 | grep -v Warn | grep -E "summary|  (default|bn64|s256|b256)|attention|!!"
echo "profile $(( $(date +%s) - t0 )) s"
for r in 1 2; do
for v in 128 64; do
  timeout 110 python3 -c "
import sys, runpy
from mmserve.kernels import triton_attention as a
a.BLOCK_N = $v
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${v}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "BLOCK_N=$v round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
