# Session 25, start 1: the step's copies by kernel (triton_copy) against DMA, the 135M's
# lm_head tiles (K = 576), the step's trace with the kernels; GPU tests of the copies.
# Carries part 00 of the default model's GGUF out of the checkout for the next call.
export PYTHONUNBUFFERED=1
cp .carry/smol.part00 /tmp/smol.part00 && echo "part00 kept"
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_copy.py \
  tests/engine/test_cuda_graphs.py 2>&1 | tail -5 | tee $OUT/tests_copy.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/copy_ab.py --rounds 4 --out $OUT/copy_ab.json 2>&1 | grep -v Warn | tail -10
echo "ab $(( $(date +%s) - t0 )) s"
timeout 100 python3 bench/step_trace.py --steps 40 --out $OUT/trace135.json 2>&1 | grep -v Warn | tail -25
rm -f $OUT/*.chrome.json
echo "trace $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 bench/tile_sweep.py $OUT/lm_head_sweep.json smollm2-135m --only widths --width 49152 --pairs 2 2>&1 | grep -v Warn | tail -12
echo "all $(( $(date +%s) - t0 )) s"
