# Probe code (not kept): chains_probe.diff, applied to HEAD 31a0c10.
# Session 28, start 1: probe. Each GEMM phase's K loop as C chains of 64-column blocks
# (block b to chain b mod C, all in flight together, summed in chain order) instead of one
# chain of k16 steps: the twice probes (session 26) priced a K step at ~33 cycles a k16
# product, the HMMA latency, so the loops may be chain-bound. The stack alone (bits differ
# from the layers'), against the default; and the refactored one-chain loop's bits.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 240 python3 bench/stack_profile.py --ctx 120 200 --rounds 2 --no-engine --out $OUT/ab_chains.json \
  --variant 'c334={"chains": {"576": 3, "1536": 4}}' \
  --variant 'c338={"chains": {"576": 3, "1536": 8}}' \
  --variant 'c222={"chains": {"576": 2, "1536": 2}}' \
  --variant 'c118={"chains": {"1536": 8}}' 2>&1 | grep -v Warn | tail -40
echo "profile $(( $(date +%s) - t0 )) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
  tests/kernels/test_triton_decode_stack.py -k "equals_the_layers" -x 2>&1 | tail -4
echo "tests $(( $(date +%s) - t0 )) s"
