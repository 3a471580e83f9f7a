# Session 28, start 7: start 6 put every loop at 5 or 6 stages: the GEMM
# phases' program 0 -0.1 to -0.15 us each, the attention phase +0.25 to +0.55 us, the
# replay within 1 %. Here only the GEMM phases' K loops get the depth (tl.range's
# num_stages, TUNING["gemm_stages"]); the attention loop keeps the kernel's 4.
# Prediction: the GEMM gains without the attention's loss, ~-0.4 us a layer, ~-12 us.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 400 python3 bench/stack_profile.py --ctx 120 200 --rounds 3 --no-engine --out $OUT/ab_gemm_stages.json \
  --variant 'ks5={"gemm_stages": 5}' --variant 'ks6={"gemm_stages": 6}' 2>&1 | grep -v Warn | grep -A20 "^summary"
python3 - <<'PY'
import json, os, statistics as st
d = json.load(open(os.environ["OUT"] + "/ab_gemm_stages.json"))
for setting in ("default", "ks5", "ks6"):
    for ctx in (120, 200):
        rows = [r for r in d["rows"] if r["setting"] == setting and r["ctx"] == ctx]
        print(setting, ctx, " ".join(f"{p} {st.median(r[p]['critical_us'] for r in rows):.2f}/{st.median(r[p]['program0_us'] for r in rows):.2f}"
                                     for p in ("qkv", "attention", "o", "gate_up", "down")))
PY
echo "profile $(( $(date +%s) - t0 )) s"
