# Session 29, start 5: the prize of weights on chip when a GEMM phase's barrier opens
# (session 28's lead 1), priced in registers outside the stack: bench/weights_across_barrier.py
# on the o, QKV and down shapes of SmolLM2-135M (96 programs, batch-1 row, 300 rounds);
# start 7: modes 3-4, the product in Gluon from shared memory (weights copied before / after);
# start 8: mode 5, as 3 in four chains summed in a fixed order (other bits).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 400 python3 bench/weights_across_barrier.py --out $OUT/weights_across_barrier.json 2>&1 | grep -v Warn | tail -8
echo "probe $(( $(date +%s) - t0 )) s"
