export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_fused.py -k "wide_thin or gate_up_silu or wide_model or gated" 2>&1 | tail -6 | tee $OUT/tests_f.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout $(( 420 - $(date +%s) + t0 )) python3 bench/throughput.py --models llama3-8b smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf --variants invariant --out-dir $OUT/tp > $OUT/tp.log 2>&1
grep -v -i warn $OUT/tp.log | tail -14
echo "tp $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 bench/throughput.py --models llama3-8b smollm2-135m --batch-sizes 1 --eager-steps 0 --no-hf --variants invariant --sync --out-dir $OUT/tp_sync > $OUT/tp_sync.log 2>&1
grep -v -i warn $OUT/tp_sync.log | tail -8
echo "tp_sync $(( $(date +%s) - t0 )) s"
