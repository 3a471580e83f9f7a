# Session 21, start 1: the grid barrier's arrival and poll (grid_sync MODE 0 atomics, 1 thread 0
# red + ld.acquire polls, 2 every thread polls): microbenchmark, GPU tests, stack A/B
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 120 python3 bench/grid_barrier.py --modes 0 1 2 --out $OUT/grid_barrier.json 2>&1 | grep -v Warn | grep barrier
echo "barrier $(( $(date +%s) - t0 )) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_grid.py \
  tests/kernels/test_triton_decode_stack.py -k "grid_sync or equals_the_layers" 2>&1 | tail -5 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab1.json \
  --variant 'bar1={"barrier": 1}' --variant 'bar2={"barrier": 2}' 2>&1 | grep -v Warn | grep -A 30 summary
echo "ab $(( $(date +%s) - t0 )) s"
