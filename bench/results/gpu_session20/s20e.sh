# Session 20 (last call): end to end, bench/throughput.py (ahead decode, random weights)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp135 2>&1 | grep -v Warn | tail -8
echo "135m $(( $(date +%s) - t0 )) s"
timeout $(( 400 - $(date +%s) + t0 )) python3 bench/throughput.py --models llama3-8b --batch-sizes 1 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp8b 2>&1 | grep -v Warn | tail -6
echo "8b $(( $(date +%s) - t0 )) s"
timeout $(( 470 - $(date +%s) + t0 )) python3 bench/stack_profile.py --ctx 600 --rounds 2 --no-engine --out $OUT/ab600.json \
  --variant 'two_dots={"gated_one_dot": false}' 2>&1 | grep -v Warn | grep -A 8 summary
echo "ab600 $(( $(date +%s) - t0 )) s"
