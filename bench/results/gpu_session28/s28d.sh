# Probe code (not kept): chains3d_probe.diff, applied to HEAD 31a0c10.
# Session 28, start 4: the chains probe again, built so a K step keeps one load per operand
# (start 1's version loaded each 64-column block on its own, 8 loads a step at 8 chains, and
# read slower everywhere): a K step loads C blocks as one (C, rows, 64) tile and runs one
# batched product (tl.dot on 3-D tiles: mma.sync, the batch over the warps), the chains
# summed at the end as a pairwise tree. Prediction from the twice probes' fit (a K loop ~0.6
# us + ~33 cycles a chained k16 product): 4 chains at K = 576 -0.45 us a phase, 8 at 1,536
# -1.6 us; ~-2.9 us a layer. The compile check reads 272-540 B spilled against 64.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 420 python3 bench/stack_profile.py --ctx 120 --rounds 2 --no-engine --out $OUT/ab_chains3d.json \
  --variant 'c224={"chains": {"576": 2, "1536": 4}}' \
  --variant 'c448={"chains": {"576": 4, "1536": 8}}' \
  --variant 'c114={"chains": {"1536": 4}}' \
  --variant 'c118={"chains": {"1536": 8}}' 2>&1 | grep -v Warn | grep -A20 "^summary"
python3 - <<'PY'
import json, os, statistics as st
d = json.load(open(os.environ["OUT"] + "/ab_chains3d.json"))
for setting in ("default", "c224", "c448", "c114", "c118"):
    rows = [r for r in d["rows"] if r["setting"] == setting]
    print(setting, " ".join(f"{p} {st.median(r[p]['critical_us'] for r in rows):.2f}/{st.median(r[p]['program0_us'] for r in rows):.2f}"
                            for p in ("qkv", "attention", "o", "gate_up", "down")))
PY
echo "profile $(( $(date +%s) - t0 )) s"
