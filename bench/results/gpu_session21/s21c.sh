# Session 21, start 3: q_regs on (default); the attention's keys a step ahead and gate/up as two
# products against it at 250 and 600 cached tokens; then end to end (bench/throughput.py,
# ahead decode, random weights): SmolLM2-135M batch 1, Llama-3-8B batch 1 and 64 + 2k prefill
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 bench/stack_profile.py --ctx 250 600 --rounds 2 --no-engine --out $OUT/ab3.json \
  --variant 'att2={"att_prefetch": 2}' --variant 'two_dot={"gated_one_dot": false}' 2>&1 | grep -v Warn | grep -A 30 summary
echo "ab $(( $(date +%s) - t0 )) s"
timeout 130 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp135 2>&1 | grep -v Warn | tail -6
echo "135m $(( $(date +%s) - t0 )) s"
timeout $(( 585 - $(date +%s) + t0 )) python3 bench/throughput.py --models llama3-8b --batch-sizes 1 64 --eager-steps 0 --no-hf --variants invariant --prefill-len 2048 --out-dir $OUT/tp8b 2>&1 | grep -v Warn | tail -8
echo "8b $(( $(date +%s) - t0 )) s"
