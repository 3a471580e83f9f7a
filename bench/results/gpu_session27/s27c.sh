# Session 27, start 2: the rest of the fused kernels' GPU tests (start 1's call ran out of
# time after 89 of them, none failed); the normed GEMMs' prefill tiles new against old
# (bench/norm_tiles_ab.py, two processes a round, alternated); the stack's phases with the
# hand-over against the rows' norm (stack_profile: same bits asserted).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_fused.py \
  -k "deep or thin or wide or unfused or whole_model or fp8 or pairwise" 2>&1 | tail -5 | tee $OUT/tests_fused_rest.log
echo "tests $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  PYTHONPATH=$PWD:/tmp/site timeout 60 python3 bench/norm_tiles_ab.py --label new --out $OUT/tiles_new_$r.json 2>&1 | grep -v Warn
  PYTHONPATH=$PWD/.carry/old:/tmp/site timeout 60 python3 bench/norm_tiles_ab.py --label old --out $OUT/tiles_old_$r.json 2>&1 | grep -v Warn
done
echo "tiles $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab_rows.json \
  --variant 'rows={"defer": false}' 2>&1 | grep -v Warn | grep -v "^\[" | tail -30
echo "all $(( $(date +%s) - t0 )) s"
