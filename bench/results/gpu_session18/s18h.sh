export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_fused.py -k "residual or row_bits or wide_model" tests/kernels/test_triton_matmul.py 2>&1 | tail -4 | tee $OUT/tests.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/tile_sweep.py $OUT/tile_sweep_final.json llama3-8b --only combos --pairs 3 2>&1 | grep -v -i warn | tail -4
echo "sweep $(( $(date +%s) - t0 )) s"
timeout $(( 370 - $(date +%s) + t0 )) python3 bench/throughput.py --models llama3-8b --batch-sizes 1 64 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp > $OUT/tp.log 2>&1
tail -5 $OUT/tp.log
echo "tp $(( $(date +%s) - t0 )) s"
