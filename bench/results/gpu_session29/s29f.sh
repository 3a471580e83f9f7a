# Session 29, start 9: the stack's loop (mode 0) on the down shape with deeper pipelines (all
# 24 K steps of 64 in flight is what Gluon's unrolled product does, 0.4-0.5 us a round
# faster at start 7-8): --stages 12 and 24.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
for st in 12 24; do
  timeout 100 python3 bench/weights_across_barrier.py --shapes 576x1536,576x576 --stages $st --out $OUT/wab_stages$st.json 2>&1 | grep -v Warn | tail -3
done
