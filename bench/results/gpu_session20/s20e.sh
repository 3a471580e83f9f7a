# Session 20 (last call): end to end, bench/throughput.py (ahead decode, random weights), SmolLM2-135M
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 170 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp135 2>&1 | grep -v Warn | tail -8
echo "135m $(( $(date +%s) - t0 )) s"
# then, on the same warm machine (one call):
# timeout 190 python3 bench/throughput.py --models llama3-8b --batch-sizes 1 --eager-steps 0 --no-hf --variants invariant --prefill-len 2048 --out-dir $OUT/tp8b
