# Session 24, start 1: every product's K in segments of chains (triton_matmul.k_chains:
# 576 -> 3, 1536 -> 4, side by side in thin tiles, in turn in wide ones): the stack's
# replay and phase table against one chain (the old arithmetic);
# end to end on both shapes; then the GPU tests of the bits (GEMM row/tile invariance,
# the stack against the layers)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 150 python3 bench/stack_profile.py --ctx 120 250 --rounds 2 --no-engine --out $OUT/ab_chains.json \
  --variant 'one={"chains": {"max": 1}}' \
  2>&1 | grep -v Warn | grep -v "^\[" | grep -v "^  [a-z_]* *critical"
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
timeout 170 python3 bench/throughput.py --models llama3-8b smollm2-135m --batch-sizes 1 64 --eager-steps 0 --no-hf \
    --variants invariant --prefill-len 2048 --out-dir $OUT/tp1 2>&1 | grep -v Warn | tail -9
python3 -c "import json; d=json.load(open('$OUT/tp1/throughput.json')); print({m: v['engine']['invariant'].get('row0_same_tokens_every_batch') for m, v in d['models'].items()})"
rm -f $OUT/tp1/*.png
echo "tp1 $(( $(date +%s) - t0 )) s"
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x \
  tests/kernels/test_triton_matmul.py 2>&1 | tail -4 | tee $OUT/tests_matmul.log
echo "matmul tests $(( $(date +%s) - t0 )) s"
timeout 110 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x \
  tests/kernels/test_triton_fused.py 2>&1 | tail -4 | tee $OUT/tests_fused.log
echo "fused tests $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -x \
  tests/kernels/test_triton_decode_stack.py -k "equals_the_layers" 2>&1 | tail -5 | tee $OUT/tests_stack.log
echo "all $(( $(date +%s) - t0 )) s"
