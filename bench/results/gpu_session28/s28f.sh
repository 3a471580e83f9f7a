# Session 28, start 6 (the first try got no machine): start 5's stage curve (2 -> 3 -> 4 stages: 720 -> 547
# -> 503 us) is steep where it was last measured flat (sessions 20 and 23: 5 and 6 stages no
# faster, on older code); 5 and 6 again on this code. Speed only, the same bits.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 420 python3 bench/stack_profile.py --ctx 120 200 --rounds 2 --no-engine --out $OUT/ab_stages.json \
  --variant 'stages5={"num_stages": 5}' --variant 'stages6={"num_stages": 6}' 2>&1 | grep -v Warn | grep -A20 "^summary"
python3 - <<'PY'
import json, os, statistics as st
d = json.load(open(os.environ["OUT"] + "/ab_stages.json"))
for setting in ("default", "stages5", "stages6"):
    for ctx in (120, 200):
        rows = [r for r in d["rows"] if r["setting"] == setting and r["ctx"] == ctx]
        print(setting, ctx, " ".join(f"{p} {st.median(r[p]['critical_us'] for r in rows):.2f}/{st.median(r[p]['program0_us'] for r in rows):.2f}"
                                     for p in ("qkv", "attention", "o", "gate_up", "down")))
PY
echo "profile $(( $(date +%s) - t0 )) s"
