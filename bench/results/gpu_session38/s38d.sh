# Session 38 (carry [".whl"]): 1. a GEMM phase fed by tags in the data, in Gluon
# (bench/handoff_gemm.py: the row polled once into shared memory, no grid barrier),
# against the same Gluon product after grid barriers. Prediction (H200 session 29: 3.43
# us a round with barriers at the o shape): -0.15 to -0.35 us a handoff, two a round.
# 2. s38c.sh: the batch-1 step's trace, throughput.py three times, the barrier's tests.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 bench/handoff_gemm.py --out $OUT/handoff_gemm.json 2>&1 | grep -v Warn | tail -12
echo "handoff_gemm $(( $(date +%s) - t0 )) s"
bash bench/results/gpu_session38/s38c.sh 2>&1 | grep -v "^NVIDIA"
