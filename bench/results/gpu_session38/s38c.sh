# Session 38 (carry [".whl"]): where the batch-1 step's time goes now (the Q8_0 head, the
# serial k_t / v_l1 default), throughput.py batch 1 three times, for the record; the
# barrier's GPU tests (one kernel for both barriers since the first run).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 bench/step_trace.py --q8-head --start 128 --steps 40 --out $OUT/step_trace.json \
  2>&1 | grep -v Warn | tail -30
rm -f $OUT/step_trace.json.chrome.json
echo "trace $(( $(date +%s) - t0 )) s"
for i in 1 2 3; do
  timeout 80 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 \
    --no-hf --q8-head --variants invariant --prefill-len 256 --out-dir $OUT/tp$i \
    2>&1 | grep -v Warn | grep -E "^smollm2-135m +invariant"
done
rm -f $OUT/tp*/*.png
echo "tp $(( $(date +%s) - t0 )) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short -n 8 \
  tests/kernels/test_triton_grid.py 2>&1 | tail -2
echo "tests $(( $(date +%s) - t0 )) s"
