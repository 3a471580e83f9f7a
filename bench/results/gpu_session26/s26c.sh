# Session 26, start 4: the deferred-rstd speed probe (TUNING["defer"]: the normed products
# read rows already multiplied by the norm weight, their producers' partial sums of squares
# give 1 / rms, applied to the accumulator; another arithmetic, so other bits) against the
# default, the stack alone, alternated. Ran three times (starts 4, 5, 6) with the partial
# sums by tl.sum, by ordered fp32 dots, by a pairwise tree; the outputs renamed here
# ab_defer1_tlsum.json, ab_defer2_ieeedot.json, ab_defer3_pairtree.json. The code: defer.diff.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 300 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab_defer.json \
  --variant 'defer={"defer": true}' \
  2>&1 | grep -v Warn | grep -v "^\[" | grep -v "^  [a-z_]* *critical" | grep -v "^ *\^\|^  *[a-z_]* = \|^    " | tail -12
python3 - <<'PY'
import json, os, statistics
d = json.load(open(os.environ["OUT"] + "/ab_defer.json"))
for ctx in (120, 250):
    for name in ("default", "defer"):
        rows = [r for r in d["rows"] if r["setting"] == name and r["ctx"] == ctx]
        if not rows: continue
        ph = {p: statistics.median(r[p]["critical_us"] for r in rows) for p in ("qkv", "attention", "o", "gate_up", "down")}
        p0 = {p: statistics.median(r[p]["program0_us"] for r in rows) for p in ("qkv", "o", "gate_up", "down")}
        g = statistics.median(r["stack_graph_us"] for r in rows)
        print(ctx, f"{name:8s}", f"graph {g:.1f}", " ".join(f"{p} {v:.2f}" for p, v in ph.items()), "| p0", " ".join(f"{v:.2f}" for v in p0.values()), f"diff {max(r.get('max_abs_diff', 0) for r in rows):.3g}")
PY
echo "all $(( $(date +%s) - t0 )) s"
