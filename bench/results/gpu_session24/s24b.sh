# Session 24, start 2: K in chains for K <= 2048 only (k_chains' max_k: the 8B's K = 4096
# and 14336 back to one chain after start 1 read 224 tok/s at batch 1 against 242); the
# stack's constexpr K fixed (start 1's stack did not compile). The stack against one
# chain, end to end on both shapes, then the GPU tests of the bits
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
timeout 120 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab_chains.json \
  --variant 'one={"chains": {"max": 1}}' \
  2>&1 | grep -v Warn | grep -v "^\[" | grep -v "^  [a-z_]* *critical" | grep -v "^ *\^\|^  *[a-z_]* = \|^    "
echo "ab $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, statistics
d = json.load(open(os.environ["OUT"] + "/ab_chains.json"))
for ctx in (120, 250):
    for name in ("default", "one"):
        rows = [r for r in d["rows"] if r["setting"] == name and r["ctx"] == ctx]
        if not rows: continue
        ph = {p: statistics.median(r[p]["critical_us"] for r in rows) for p in ("qkv", "attention", "o", "gate_up", "down")}
        print(ctx, f"{name:8s}", " ".join(f"{p} {v:.2f}" for p, v in ph.items()), f"diff {max(r['max_abs_diff'] for r in rows):.3g}")
PY
timeout 130 python3 bench/throughput.py --models smollm2-135m llama3-8b --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp 2>&1 | grep -v Warn | tail -9
python3 -c "import json; d=json.load(open('$OUT/tp/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
rm -f $OUT/tp/*.png
echo "tp $(( $(date +%s) - t0 )) s"
timeout $(( 385 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=line -x \
  tests/kernels/test_triton_matmul.py tests/kernels/test_triton_decode_stack.py -k "equals_the_layers or row_bits or float_out or matches" 2>&1 | tail -4 | tee $OUT/tests_stack.log
echo "all $(( $(date +%s) - t0 )) s"
