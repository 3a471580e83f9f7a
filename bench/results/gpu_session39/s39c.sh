# Session 39 (carry [".whl"]): s39a/b's step_ab rounds fell in two groups (~565-570 and
# ~583-595 us) for one setting on an H100. Per capture: the step twice, and the stack's
# buffer addresses (bench/placement_probe.py), 14 captures.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 400 python3 bench/placement_probe.py --rounds 14 --out $OUT/placement.json 2>&1 \
  | grep -v Warn | tail -18
echo "probe $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
