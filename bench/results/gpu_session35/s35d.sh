# Session 35, call 4 (carry [".whl", ".carry/smol.part01"], right after s35c.sh, which left the
# GGUF's first half in /tmp). The real default model's Q8_0 head on the GPU: the model converted
# from the GGUF on the machine, its head's blocks attached, their logits the bf16 weight's
# (test_q8.py's CUDA test); its batch-1 decode in throughput.py as the server loads it (the
# blocks against the bf16 head); step_ab.py's A/B of the head on the random shape (3 rounds at
# 129-228 cached tokens); the engine's async tests on the real model, as time allows.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mmhome/downloads && cat /tmp/smol.part00 .carry/smol.part01 > /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 && echo "gguf ok"
export MMSERVE_HOME=/tmp/mmhome
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short tests/kernels/test_q8.py 2>&1 | tail -4
echo "test_q8 $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/throughput.py --models smollm2-135m-instruct --batch-sizes 1 \
  --eager-steps 0 --no-hf --variants invariant bf16head --prefill-len 256 \
  --out-dir $OUT/tp_real 2>&1 | grep -v Warn | grep -E "invariant|bf16head|row 0" | tail -3
rm -f $OUT/tp_real/*.png
echo "tp real $(( $(date +%s) - t0 )) s"
timeout 150 python3 bench/step_ab.py --q8-head --out $OUT/step_ab_q8.json --rounds 3 --starts 128 \
  --variant 'bf16head={"q8_head": false}' 2>&1 | grep -v Warn | tail -3
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout $(( 500 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/engine/test_async_scheduling.py 2>&1 | tail -4
echo "async $(( $(date +%s) - t0 )) s"
