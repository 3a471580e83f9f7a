# Session 35, call 4 (carry [".whl", ".carry/smol.part01"], right after s35c.sh). The real default model's Q8_0 head on the
# GPU: run right after a call that carried .carry/smol.part00 and copied it to /tmp (as
# session 32's s32b.sh / s32c.sh), carrying .carry/smol.part01 and .whl. The model is
# converted from the GGUF on the machine; its LM head must come up with its blocks attached
# and give the bf16 weight's logits (test_q8.py's CUDA test), and the engine's async tests
# run through the blocks. Then the real default model's batch-1 decode in throughput.py
# (its weights from the GGUF, as the server loads them), the blocks against the bf16 head.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mmhome/downloads && cat /tmp/smol.part00 .carry/smol.part01 > /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 && echo "gguf ok"
export MMSERVE_HOME=/tmp/mmhome
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_q8.py tests/engine/test_async_scheduling.py 2>&1 | tail -8
echo "tests $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  timeout 120 python3 bench/throughput.py --models smollm2-135m-instruct --batch-sizes 1 \
    --eager-steps 0 --no-hf --variants invariant bf16head --prefill-len 256 \
    --out-dir $OUT/tp_real_$r 2>&1 | grep -v Warn | grep -E "invariant|bf16head|row 0" | tail -3
  rm -f $OUT/tp_real_$r/*.png
  echo "tp real $r $(( $(date +%s) - t0 )) s"
done
