# Session 30, start 1: a split as one key block (triton_attention.BLOCK_N 128 for heads under
# 128 dims, so block_keys(64) = the 128-key split) against 64-key blocks (two a split, an
# online softmax across them). Other bits. The stack's phase table at 120 / 200 / 250 cached
# tokens (serial graph at <= 256 keys as the engine replays it; the spread kernel too), then
# batch-1 end to end, alternated.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 300 python3 bench/stack_profile.py --ctx 120 200 250 --rounds 2 --no-engine --out $OUT/ab_bn.json \
  --variant 'bn64={"_bn": 64}' \
  --variant 'spread128={"_serial": 0}' 2>&1 | grep -v Warn | grep -E "^\[|summary|  (default|bn64|spread)|attention|!!"
echo "profile $(( $(date +%s) - t0 )) s"
for v in 128 64; do
  timeout 110 python3 -c "
import sys, runpy
from mmserve.kernels import triton_attention as a
a.BLOCK_N = $v
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${v}']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "BLOCK_N=$v $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}/*.png
done
