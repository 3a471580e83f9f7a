# Session 28, start 2: the attention phase at the benchmark's contexts (128-token prompt +
# 128 steps: 129-256 cached tokens, two 128-key splits: spread over two programs, the last
# to arrive merging). At 200 the phase reads 5.9 us against 4.1 at 120 (one split, one
# program). Speed-only settings: each group whole in one program (spread off), and the
# keys and values a block ahead (att_prefetch 2), alone and together.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 300 python3 bench/stack_profile.py --ctx 200 250 --rounds 2 --no-engine --out $OUT/ab_att.json \
  --variant 'serial={"spread": false}' \
  --variant 'serial_ap2={"spread": false, "att_prefetch": 2}' \
  --variant 'spread_ap2={"att_prefetch": 2}' 2>&1 | grep -v Warn | grep -A20 "^summary"
python3 - <<'PY'
import json, os, statistics as st
d = json.load(open(os.environ["OUT"] + "/ab_att.json"))
for setting in ("default", "serial", "serial_ap2", "spread_ap2"):
    for ctx in (200, 250):
        rows = [r for r in d["rows"] if r["setting"] == setting and r["ctx"] == ctx]
        print(setting, ctx, " ".join(f"{p} {st.median(r[p]['critical_us'] for r in rows):.2f}"
                                     for p in ("qkv", "attention", "o", "gate_up", "down")))
PY
echo "profile $(( $(date +%s) - t0 )) s"
