# Probe code (not kept): l1_probe.diff, applied to HEAD 31a0c10.
# Session 28, start 3: the GEMM phases' weight tiles into L1 before the barrier that opens
# their phase (each program prefetches its next tile's lines with prefetch.global.L1 after
# its work in the phase before), and the async copies through L1 (cp.async.ca: the PTX
# rewritten by a stages hook, Triton emits .cg). Prediction: the K loops are bound by the
# weight stream's L2 latency (o: 9 steps in ~1.2 us at 4 stages), so with the tiles in L1
# each GEMM phase -0.3 to -0.8 us, -1.5 to -3 us a layer. The same bits by construction.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 300 python3 bench/stack_profile.py --ctx 120 200 --rounds 2 --no-engine --out $OUT/ab_l1.json \
  --variant 'l1={"l1": 1}' --variant 'l1_gu_early={"l1": 2}' 2>&1 | grep -v Warn | grep -A20 "^summary"
python3 - <<'PY'
import json, os, statistics as st
d = json.load(open(os.environ["OUT"] + "/ab_l1.json"))
for setting in ("default", "l1", "l1_gu_early"):
    for ctx in (120, 200):
        rows = [r for r in d["rows"] if r["setting"] == setting and r["ctx"] == ctx]
        print(setting, ctx, " ".join(f"{p} {st.median(r[p]['critical_us'] for r in rows):.2f}/{st.median(r[p]['program0_us'] for r in rows):.2f}"
                                     for p in ("qkv", "attention", "o", "gate_up", "down")))
PY
echo "profile $(( $(date +%s) - t0 )) s"
