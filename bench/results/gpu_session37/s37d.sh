# Session 37, call 4 (carry [".whl"]): the serial stack's new defaults (k_t and v_l1 "serial":
# keys in the QK orientation, values asked into L1 first; the spread kernel unchanged) and
# the Q8_0 head on again. 1. GPU tests of the stack (every tuning, the new default among
# them) and the graphs; 2. step_ab, the new default against the old (k_t, v_l1 off) at
# 129-228 / 513-612 cached tokens; 3. throughput.py batch 1, alternated.
# Prediction (H100 calls 4-5 of this session): -10 to -15 us a step at 129-228, nothing at
# 513-612 (the spread kernel keeps its settings); +1 to +2 % tok/s.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_decode_stack.py tests/engine/test_cuda_graphs.py \
  -k "not o_product and not default_model" 2>&1 | tail -5
echo "tests $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/step_ab.py --q8-head --out $OUT/step_ab.json --rounds 3 --starts 128 512 \
  --variant 'old={"k_t": false, "v_l1": false}' 2>&1 | grep -v Warn | tail -3
echo "step_ab $(( $(date +%s) - t0 )) s"
for tu in '{}' '{"k_t": false, "v_l1": false}' '{}' '{"k_t": false, "v_l1": false}'; do
  timeout 80 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 \
    --no-hf --q8-head --variants invariant --prefill-len 256 --out-dir $OUT/tp --tuning "$tu" \
    2>&1 | grep -v Warn | grep -E "^smollm2-135m +invariant" | sed "s/^/$tu /"
done
rm -f $OUT/tp/*.png
echo "tp $(( $(date +%s) - t0 )) s"
