# Session 39 (carry [".whl"]): s39c showed the H100's step moving 553-696 us over time for
# one capture (the buffers at the same addresses every capture), so a head tile's ~-1.8 us
# (the head alone, s39a/b) needs paired rounds: 12 alternated rounds, the median of each
# round's difference from the default.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 400 python3 bench/step_ab.py --q8-head --starts 128 --out $OUT/step_ab_tiles.json \
  --rounds 12 --variant 't256w4={"q8_tile": [16, 256, 32, 4, 6]}' \
  --variant 't128w2={"q8_tile": [16, 128, 32, 2, 8]}' 2>&1 | grep -v Warn | tail -4
echo "step_ab $(( $(date +%s) - t0 )) s"
