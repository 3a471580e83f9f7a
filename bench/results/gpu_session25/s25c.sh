# Session 25, start 2: the normed phases' rows normed once into each program's scratch
# (TUNING["prenorm"]) against the norm in every K step, the stack alone (alternated, bits
# compared), then both shapes end to end with it and the lm_head's narrow-K tile, then the
# GPU tests of the bits
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 200 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab_prenorm.json \
  --variant 'off={"prenorm": false}' --variant 'bk512={"bk": 512}' \
  2>&1 | grep -v Warn | grep -v "^\[" | grep -v "^  [a-z_]* *critical" | grep -v "^ *\^\|^  *[a-z_]* = \|^    " | tail -20
python3 - <<'PY'
import json, os, statistics
d = json.load(open(os.environ["OUT"] + "/ab_prenorm.json"))
for ctx in (120, 250):
    for name in ("default", "off", "bk512"):
        rows = [r for r in d["rows"] if r["setting"] == name and r["ctx"] == ctx]
        if not rows: continue
        ph = {p: statistics.median(r[p]["critical_us"] for r in rows) for p in ("qkv", "attention", "o", "gate_up", "down")}
        print(ctx, f"{name:8s}", " ".join(f"{p} {v:.2f}" for p, v in ph.items()), f"diff {max(r.get('max_abs_diff', 0) for r in rows):.3g}")
PY
echo "ab $(( $(date +%s) - t0 )) s"
timeout 150 python3 bench/throughput.py --models smollm2-135m llama3-8b --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp 2>&1 | grep -v Warn | tail -9
python3 -c "import json; d=json.load(open('$OUT/tp/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
rm -f $OUT/tp/*.png
echo "tp $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x \
  tests/kernels/test_triton_matmul.py tests/kernels/test_triton_decode_stack.py tests/kernels/test_triton_fused.py 2>&1 | tail -5 | tee $OUT/tests_stack.log
echo "all $(( $(date +%s) - t0 )) s"
