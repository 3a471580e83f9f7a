# Session 39 (carry [".whl"]), for an H200: s38c.sh (the step's trace with the Q8_0 head,
# throughput.py batch 1 three times, the barrier's GPU tests), then the head alone per tile
# (on the H100, 16x256x32x4x6 ran 15.9 against the default 16x128's 17.7 us).
bash bench/results/gpu_session38/s38c.sh
export PYTHONPATH=$PWD:/tmp/site
timeout 120 python3 bench/lm_head_q8.py --shapes 49152x576 --out $OUT/lm_head_q8.json \
  --rounds 3 --tiles 16x128x32x4x8 16x256x32x4x6 16x256x32x4x4 16x128x32x2x8 16x512x32x8x4 \
  2>&1 | grep -v Warn | tail -7
