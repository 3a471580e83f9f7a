# Session 39 (carry [".whl"]): the Q8_0 LM head, never timed alone (session 34's s34a step
# 4 never ran). The H100 trace (s38c) put it at 15.5 us for 31.8 MB (2.0 TB/s of ~3.35).
# 1. the head alone per tile, SmolLM2-135M's vocabulary, 1 row (bench/lm_head_q8.py);
# 2. the engine's batch-1 step per head setting (step_ab.py --q8-head, 3 alternated rounds,
#    129-228 cached tokens): the early L2 ask (Q8_EARLY 18 / 4) and three other tiles.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 bench/lm_head_q8.py --shapes 49152x576 --out $OUT/lm_head_q8.json \
  --rounds 3 2>&1 | grep -v Warn | tail -12
echo "head $(( $(date +%s) - t0 )) s"
timeout $(( 580 - $(date +%s) + t0 )) python3 bench/step_ab.py --q8-head --starts 128 \
  --out $OUT/step_ab_head.json --rounds 3 \
  --variant 'early18={"q8_early": 18}' --variant 'early4={"q8_early": 4}' \
  --variant 't64={"q8_tile": [16, 64, 32, 4, 8]}' --variant 't32={"q8_tile": [16, 32, 32, 2, 8]}' \
  --variant 't256={"q8_tile": [16, 256, 32, 8, 6]}' 2>&1 | grep -v Warn | tail -8
echo "step_ab $(( $(date +%s) - t0 )) s"
