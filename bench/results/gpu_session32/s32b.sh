# Session 32, call 2: the step's tail shortened (the embedding's gather and the counters'
# zeroing in the stack's input kernel; the last step's tokens to the host in the next
# step's input copy) against HEAD c782057 (carried in .carry/old), throughput.py batch 1
# alternated, 3 rounds; the new step's trace; the GPU tests of what changed. Keeps part 00
# of the default model's GGUF for call 3.
export PYTHONUNBUFFERED=1
cp .carry/smol.part00 /tmp/smol.part00 && echo "part00 kept"
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
for r in 1 2 3; do
for v in new old; do
  if [ $v = new ]; then P=$PWD; else P=$PWD/.carry/old; fi
  PYTHONPATH=$P:/tmp/site timeout 90 python3 $P/bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 256 --out-dir $OUT/tp_${v}_$r 2>&1 | grep -v Warn | grep invariant | tail -1
  echo "$v $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
export PYTHONPATH=$PWD:/tmp/site
timeout 80 python3 bench/step_trace.py --steps 40 --out /tmp/step_trace.json 2>&1 | grep -v Warn | tail -14
echo "trace $(( $(date +%s) - t0 )) s"
timeout $(( 540 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_triton_copy.py tests/engine/test_cuda_graphs.py tests/engine/test_graph_inputs.py \
  tests/kernels/test_triton_decode_stack.py -k "not tuning" 2>&1 | tail -8
echo "tests $(( $(date +%s) - t0 )) s"
