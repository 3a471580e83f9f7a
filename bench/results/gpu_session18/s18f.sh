export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_fused.py -k "residual or row_bits or wide_model" 2>&1 | tail -5 | tee $OUT/fused_tests.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout 150 python3 bench/tile_sweep.py $OUT/tile_sweep_new_default.json llama3-8b --only combos --pairs 4 2>&1 | grep -v -i warn | tail -4
echo "sweep $(( $(date +%s) - t0 )) s"
timeout 150 python3 bench/pdl_trigger_ab.py $OUT/gated_ahead_ab.json llama3-8b --pairs 3 --only gated,gated_down_ahead_2048,gated_down_ahead_4096 2>&1 | grep -v -i warn | tail -5
echo "ab $(( $(date +%s) - t0 )) s"
timeout $(( 480 - $(date +%s) + t0 )) python3 bench/chain_profile.py $OUT/chain_new.json llama3-8b --only gated_down_ahead_2048 2>&1 | grep -v -i warn | grep -v "kernels a step" | tail -30
