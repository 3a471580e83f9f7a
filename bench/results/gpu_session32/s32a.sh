# Session 32, call 1: step_ab.py as a bench file (lead 0: qkv_hoist's gain on this
# machine, att_hoist 1 alone), the step's trace at HEAD, throughput.py at HEAD.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
timeout 330 python3 bench/step_ab.py --out $OUT/step_ab.json --rounds 3 \
  --variant 'qh_off={"qkv_hoist": false}' \
  --variant 'h1={"att_hoist": 1, "qkv_hoist": false}' 2>&1 | grep -v Warn | tail -8
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout 90 python3 bench/step_trace.py --steps 40 --out $OUT/step_trace.json 2>&1 | grep -v Warn | tail -30
echo "trace $(( $(date +%s) - t0 )) s"
timeout 80 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 --no-hf \
  --variants invariant --prefill-len 256 --out-dir $OUT/tp 2>&1 | grep -v Warn | grep invariant | tail -2
rm -f $OUT/tp/*.png
echo "done $(( $(date +%s) - t0 )) s"
