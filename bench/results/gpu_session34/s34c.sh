# Prepared in session 34, NOT RUN (no device lent). The rest of the Q8_0 head's measures, after
# s34a.sh: throughput.py again (batch 1, --q8-head, invariant against bf16head, alternated
# order), the head alone at 64 rows (the 64-row tiles, for a Q8_MAX_ROWS above 16), and
# Q8_EARLY at 4 blocks in the engine's step. Carry [".whl"].
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 100 python3 bench/throughput.py --models smollm2-135m --batch-sizes 1 --eager-steps 0 \
  --no-hf --q8-head --variants bf16head invariant --prefill-len 256 --out-dir $OUT/tp_q8_2 \
  2>&1 | grep -v Warn | grep -E "invariant|bf16head|row 0" | tail -3
rm -f $OUT/tp_q8_2/*.png
echo "tp $(( $(date +%s) - t0 )) s"
timeout 120 python3 bench/lm_head_q8.py --rows 64 --shapes 49152x576 --out $OUT/lm_head_q8_64.json \
  --rounds 3 2>&1 | grep -v Warn | tail -6
echo "head64 $(( $(date +%s) - t0 )) s"
timeout 200 python3 bench/step_ab.py --q8-head --out $OUT/step_ab_early.json --rounds 3 \
  --variant 'early4={"q8_early": 4}' --variant 'early18={"q8_early": 18}' 2>&1 \
  | grep -v Warn | tail -4
echo "step_ab $(( $(date +%s) - t0 )) s"
