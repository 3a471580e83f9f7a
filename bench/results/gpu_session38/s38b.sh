# Session 38 (carry [".whl"]): the grid barrier's wait on release words
# (``triton_grid.grid_sync_flags``, TUNING["flags"]). Prediction: the barrier alone 1.06 ->
# 0.8-0.95 us at 96-132 programs if the counter line's polls are what the extra ~0.4 us
# over one program's 0.63 is (session 33); in the engine's batch-1 step (120 barriers)
# -10 to -30 us at 129-228 cached tokens. 1. barrier_poll.py; 2. step_ab; 3. the
# barrier's GPU tests.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 150 python3 bench/barrier_poll.py --out $OUT/barrier_poll.json --programs 96 132 \
  --only r1 last_own last_own_rel last_8 last_1 lead_own lead_own_r2 lead_8 2>&1 | grep -v Warn
echo "barrier_poll $(( $(date +%s) - t0 )) s"
timeout 200 python3 bench/step_ab.py --q8-head --out $OUT/step_ab.json --rounds 3 --starts 128 \
  --variant 'fl1={"flags": [1, 0]}' --variant 'fl2={"flags": [2, 0]}' \
  --variant 'fl1_8={"flags": [1, 8]}' 2>&1 | grep -v Warn | tail -6
echo "step_ab $(( $(date +%s) - t0 )) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts= --tb=short -n 8 \
  tests/kernels/test_triton_grid.py > $OUT/grid_tests.txt 2>&1
tail -3 $OUT/grid_tests.txt
echo "tests $(( $(date +%s) - t0 )) s"
