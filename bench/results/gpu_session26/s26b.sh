# Session 26, starts 2-3: where the GEMM phases' time goes. The "twice" probes run a stage a
# second time after the first (same values, bits compared): 1 the normed phases' norm
# prologue, 2 every GEMM phase's K loop; the critical path's growth is that stage's time.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 300 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab_twice${RUN:-}.json \
  --variant 'norm2={"twice": 1}' --variant 'loop2={"twice": 2}' \
  2>&1 | grep -v Warn | grep -v "^\[" | grep -v "^  [a-z_]* *critical" | grep -v "^ *\^\|^  *[a-z_]* = \|^    " | tail -20
python3 - <<'PY'
import json, os, statistics
d = json.load(open(os.environ["OUT"] + "/ab_twice" + os.environ.get("RUN", "") + ".json"))
for ctx in (120, 250):
    for name in ("default", "norm2", "loop2"):
        rows = [r for r in d["rows"] if r["setting"] == name and r["ctx"] == ctx]
        if not rows: continue
        ph = {p: statistics.median(r[p]["critical_us"] for r in rows) for p in ("qkv", "attention", "o", "gate_up", "down")}
        p0 = {p: statistics.median(r[p]["program0_us"] for r in rows) for p in ("qkv", "o", "gate_up", "down")}
        g = statistics.median(r["stack_graph_us"] for r in rows)
        print(ctx, f"{name:8s}", f"graph {g:.1f}", " ".join(f"{p} {v:.2f}" for p, v in ph.items()), "| p0", " ".join(f"{v:.2f}" for v in p0.values()), f"same {all(r.get('same_bits_as_default', True) for r in rows)}")
PY
echo "all $(( $(date +%s) - t0 )) s"
