# Session 38 (carry [".whl"]): short, since the device budget was spent on refused starts:
# bench/handoff_gemm.py, then the barrier's GPU tests (one rounds kernel
# for both barriers since s38b), then one throughput.py batch-1 run for the record.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 bench/handoff_gemm.py --out $OUT/handoff_gemm.json 2>&1 | grep -v Warn | tail -12
echo "handoff_gemm $(( $(date +%s) - t0 )) s"
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short -n 8 \
  tests/kernels/test_triton_grid.py 2>&1 | tail -2
echo "tests $(( $(date +%s) - t0 )) s"
timeout 80 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 \
  --no-hf --q8-head --variants invariant --prefill-len 256 --out-dir $OUT/tp \
  2>&1 | grep -v Warn | grep -E "^smollm2-135m +invariant"
rm -f $OUT/tp/*.png
echo "tp $(( $(date +%s) - t0 )) s"
