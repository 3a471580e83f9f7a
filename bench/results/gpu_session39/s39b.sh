# Session 39 (carry [".whl"]), after s39a: the head alone at 4-warp tiles wider than s39a's
# (16x256x32x4x6 was its fastest, 15.8 against the default's 17.7 us), then the engine's
# step with that tile (s39a ran 16x256 with 8 warps) and the early L2 ask, 5 rounds (s39a's
# 3 rounds spread 564-588 us for one setting).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 bench/lm_head_q8.py --shapes 49152x576 --out $OUT/lm_head_q8_b.json \
  --rounds 3 --tiles 16x128x32x4x8 16x256x32x4x6 16x256x32x4x4 16x256x32x4x8 16x512x32x4x4 \
  16x512x32x8x4 16x128x32x2x8 2>&1 | grep -v Warn | tail -9
echo "head $(( $(date +%s) - t0 )) s"
timeout $(( 580 - $(date +%s) + t0 )) python3 bench/step_ab.py --q8-head --starts 128 \
  --out $OUT/step_ab_head_b.json --rounds 5 \
  --variant 'early18={"q8_early": 18}' --variant 't256w4={"q8_tile": [16, 256, 32, 4, 6]}' \
  --variant 'both={"q8_early": 18, "q8_tile": [16, 256, 32, 4, 6]}' 2>&1 | grep -v Warn | tail -5
echo "step_ab $(( $(date +%s) - t0 )) s"
