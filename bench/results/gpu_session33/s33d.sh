# Session 33, call 4: where the single relaxed wait gains (129-256 cached tokens, the serial
# graph) and loses (513-612, the spread one): the stack's phases replayed alone at 200 and 600
# cached tokens, default and relaxed, and at 600 both with the serial kernel.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 500 python3 bench/stack_profile.py --ctx 200 600 --rounds 2 --no-engine --out $OUT/stack_profile.json \
  --variant 'r1={"poll": [1, 0, false]}' --variant 'ser={"_serial": 8}' \
  --variant 'r1ser={"poll": [1, 0, false], "_serial": 8}' 2>&1 | grep -v Warn | tail -60
echo "profile $(( $(date +%s) - t0 )) s"
