# Session 27, start 3: pair_sum's levels as sums over pairs (tl.sum of a size-2 axis: warp
# shuffles where a pair spans threads) in place of tl.split of a reshape (layout
# conversions through shared memory: 71 bar.sync in the thin normed GEMM's PTX against 8);
# the same bits by construction. Tests of the bits (the tree, rows across tiles, the stack
# with and without the hand-over), the stack's phases, and SmolLM2-135M new against old
# with and without the stack (the layered variant runs the thin normed tiles).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short tests/kernels/test_triton_fused.py \
  tests/kernels/test_triton_decode_stack.py -k "pairwise or row_bits or real_model or smollm2_widths or 1-None or tuning15 or tuning16 or tuning17 or tuning18" 2>&1 | tail -5 | tee $OUT/tests_bits.log
echo "tests $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/stack_profile.py --ctx 120 --rounds 2 --no-engine --out $OUT/ab_rows.json \
  --variant 'rows={"defer": false}' 2>&1 | grep -v Warn | grep -A8 "^summary"
echo "profile $(( $(date +%s) - t0 )) s"
for r in 1 2; do
for v in new old; do
  if [ $v = new ]; then P=$PWD; else P=$PWD/.carry/old; fi
  PYTHONPATH=$P:/tmp/site timeout 100 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant layered --prefill-len 2048 --out-dir $OUT/tp_${v}_$r 2>&1 | grep -v Warn | grep "invariant\|layered"
  echo "$v $r $(( $(date +%s) - t0 )) s"
  rm -f $OUT/tp_${v}_$r/*.png
done
done
