# Session 23, start 1: what the 135M batch-1 engine step holds besides the stack
# (bench/step_trace.py, profiler trace), and the stack's phase table with the engine step
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 bench/step_trace.py --steps 40 --out $OUT/trace135.json 2>&1 | grep -v Warn
echo "trace $(( $(date +%s) - t0 )) s"
rm -f $OUT/*.chrome.json
timeout 200 python3 bench/stack_profile.py --ctx 120 190 250 --rounds 1 --out $OUT/profile.json 2>&1 | grep -v Warn
echo "all $(( $(date +%s) - t0 )) s"
