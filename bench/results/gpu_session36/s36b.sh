# Session 36, call 2 (carry [".whl"], right after s36a.sh): step_ab.py --q8-head at 129-228
# cached tokens: default against og (o_groups, fused: a tile's last item sums the chains),
# og2 (phase D sums them), og_r / og2_r (the same with the chain's operand from the
# attention's registers), og_c (o_groups, phase C on its own) and noc (the probe: phase C
# and its barrier skipped, wrong bits). Prediction (bench/NOTES.md, session 36): og -25 to
# -35 us a step, og_c +0 to +2, noc -60 to -90.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 570 python3 bench/step_ab.py --q8-head --out $OUT/step_ab_og.json \
  --rounds 3 --starts 128 --variant 'og={"o_groups": true}' \
  --variant 'og2={"o_groups": true, "o_fuse": 2}' \
  --variant 'og_r={"o_groups": true, "o_regs": true}' \
  --variant 'og2_r={"o_groups": true, "o_fuse": 2, "o_regs": true}' \
  --variant 'og_c={"o_groups": true, "o_fuse": 0}' --variant 'noc={"no_c": 1}' 2>&1 \
  | grep -v Warn | tail -9
echo "step_ab $(( $(date +%s) - t0 )) s"
