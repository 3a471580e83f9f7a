# Session 28, start 5: what bounds a GEMM phase's K loop, by speed-only settings (same bits):
# pipeline depth (stages 2, 3 against 4: if the loop is bound by the weight bytes in
# flight, fewer stages are slower in proportion) and the down product's K step (128: twice
# the steps, half the bytes each; 512: half the steps; if the loop is bound by per-step
# overhead, time follows the step count, if by bytes it stays).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site
timeout 420 python3 bench/stack_profile.py --ctx 120 --rounds 2 --no-engine --out $OUT/ab_loop.json \
  --variant 'stages3={"num_stages": 3}' --variant 'stages2={"num_stages": 2}' \
  --variant 'bk128={"bk": 128}' --variant 'bk512={"bk": 512}' 2>&1 | grep -v Warn | grep -A20 "^summary"
python3 - <<'PY'
import json, os, statistics as st
d = json.load(open(os.environ["OUT"] + "/ab_loop.json"))
for setting in ("default", "stages3", "stages2", "bk128", "bk512"):
    rows = [r for r in d["rows"] if r["setting"] == setting]
    print(setting, " ".join(f"{p} {st.median(r[p]['critical_us'] for r in rows):.2f}/{st.median(r[p]['program0_us'] for r in rows):.2f}"
                            for p in ("qkv", "attention", "o", "gate_up", "down")))
PY
echo "profile $(( $(date +%s) - t0 )) s"
