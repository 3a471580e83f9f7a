# Session 36, call 3 (carry [".whl", ".carry/smol.part01"], right after s36b.sh; s36a.sh left the
# GGUF's first half in /tmp): end to end with the o product by kv-head group, the random
# shape and the real default model from the GGUF (throughput.py batch 1, MMSERVE_O_GROUPS
# on against off, alternated), then s35d's real-model Q8_0 test. TUNE='{"o_fuse": 2}' (a JSON
# over the stack's TUNING, session 37) picks the o-group form for the runs with it on.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/mmhome/downloads && cat /tmp/smol.part00 .carry/smol.part01 > /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum /tmp/mmhome/downloads/SmolLM2-135M-Instruct.Q4_1.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 && echo "gguf ok"
export MMSERVE_HOME=/tmp/mmhome
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
for og in 0 1 0 1; do
  t=(); if [ $og = 1 ] && [ -n "$TUNE" ]; then t=(--tuning "$TUNE"); fi
  MMSERVE_O_GROUPS=$og timeout 100 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 \
    --eager-steps 0 --no-hf --q8-head --variants invariant --prefill-len 256 --out-dir $OUT/tp_og$og \
    "${t[@]}" \
    2>&1 | grep -v Warn | grep -E "invariant|row 0" | tail -2 | sed "s/^/og=$og /"
done
rm -f $OUT/tp_og*/*.png
echo "tp $(( $(date +%s) - t0 )) s"
for og in 0 1; do  # batch 64 too: row 0's tokens the same at 1 (the stack) and 64 (layers)
  t=(); if [ $og = 1 ] && [ -n "$TUNE" ]; then t=(--tuning "$TUNE"); fi
  MMSERVE_O_GROUPS=$og timeout 130 python3 bench/throughput.py --models smollm2-135m-instruct \
    --batch-sizes 1 64 --eager-steps 0 --no-hf --variants invariant --prefill-len 256 \
    "${t[@]}" \
    --out-dir $OUT/tp_real_og$og 2>&1 | grep -v Warn | grep -E "invariant|row 0" | tail -3 | sed "s/^/real og=$og /"
  grep -rho '"row0_same_tokens_every_batch": [a-z]*' $OUT/tp_real_og$og | sed "s/^/real og=$og /"
done
rm -f $OUT/tp_real_og*/*.png
echo "tp real $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short \
  tests/kernels/test_q8.py 2>&1 | tail -4
echo "test_q8 $(( $(date +%s) - t0 )) s"
