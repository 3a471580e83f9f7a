# Ran at the parent of the commit that removed q_regs (TUNING["q_regs"] no longer exists).
# Session 22, start 2: where the stack departs from the layered step at SmolLM2-135M widths
# (the 4 of 160 steps of start 1), then the same run with session 20-21 changes off one at a time.
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
t0=$(date +%s)
timeout 200 python3 bench/stack_vs_layers.py --steps 120 --probe --serial-ref --out $OUT/probe.json 2>&1 | grep -v Warn | tail -14
echo "probe $(( $(date +%s) - t0 )) s"
for t in q_regs=0 gated_one_dot=0 unroll=8; do
  timeout 120 python3 bench/stack_vs_layers.py --steps 120 --batch 0 --repeat 1 --tuning $t --out $OUT/svl_${t%%=*}.json 2>&1 | grep -v Warn | tail -1
  echo "$t $(( $(date +%s) - t0 )) s"
done
