# Session 30, start 5: the session's code (128-key blocks, the stack's attention loop
# unpipelined) against session 29's (64-key blocks, the kernel's 4 stages) and the two
# mixes, stack replay at 120 / 200 / 600 cached tokens; batch 1 end to end, new against old,
# alternated, two rounds; then the stack's GPU tests (every tuning against the layers).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 200 python3 bench/stack_profile.py --ctx 120 200 600 --rounds 2 --no-engine --out $OUT/ab_final.json \
  --variant 'old={"_bn": 64, "att_stages": null}' \
  --variant 'bn64_st1={"_bn": 64}' \
  --variant 'bn128_st4={"att_stages": null}' 2>&1 | grep -v Warn | grep -E "summary|  (default|old|bn64_st1|bn128_st4) |!!"
echo "profile $(( $(date +%s) - t0 )) s"
for r in 1 2; do
for v in new old; do
  timeout 100 python3 -c "
import sys, runpy
from mmserve.kernels import triton_decode_stack as t, triton_attention as a
if '$v' == 'old':
    a.BLOCK_N = 64
    t.TUNING['att_stages'] = None
sys.argv = ['throughput.py', '--models', 'smollm2-135m', '--batch-sizes', '1', '--eager-steps', '0', '--no-hf',
            '--variants', 'invariant', '--prefill-len', '256', '--out-dir', '$OUT/tp_${v}_$r']
runpy.run_path('bench/throughput.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "invariant" | head -3
  echo "$v round $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
timeout $(( 570 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short tests/kernels/test_triton_decode_stack.py -k "equals_the_layers or long_context or several" 2>&1 | tail -6
echo "tests $(( $(date +%s) - t0 )) s"
