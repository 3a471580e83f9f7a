# Session 27, start 1: the fused norm's new arithmetic (rstd on the accumulator, the
# operand round(x * w), the pairwise tree) and the stack's hand-over of it (TUNING["defer"]):
# the fused kernels' tests (row bits across row counts and tiles, the tree against torch's)
# and the stack against the layers. Carries part 00 of the default model's GGUF out.
export PYTHONUNBUFFERED=1
cp .carry/smol.part00 /tmp/smol.part00 && echo "part00 kept"
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_fused.py 2>&1 | tail -8 | tee $OUT/tests_fused.log
echo "fused tests $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short --durations=8 tests/kernels/test_triton_decode_stack.py 2>&1 | tail -25 | tee $OUT/tests_stack.log
echo "all $(( $(date +%s) - t0 )) s"
