"""Session 21 probe: Llama-3-8B (128-dim heads) end to end with 64-key attention splits (the
new default for such heads, ``split_keys``) against 128 (the old), alternated in one process:
bench/throughput.py's run each time, the first with batch 64 and the 2k prefill too. All
results in one JSON (``--out``)."""
import json
import sys

sys.path.insert(0, "bench")
from mmserve.kernels import triton_attention as ta  # noqa: E402

out = sys.argv[sys.argv.index("--out") + 1]
sys.argv = ["throughput.py", "--models", "llama3-8b", "--eager-steps", "0", "--no-hf",
            "--variants", "invariant", "--prefill-len", "2048", "--out-dir", "/tmp/tp"]
import throughput  # noqa: E402

rows = []
for i, (label, keys, sizes) in enumerate([("split64", 64, [1, 64]), ("split128", 128, [1]),
                                          ("split64", 64, [1]), ("split128", 128, [1])]):
    ta.SPLIT_WIDE_HEADS = keys
    args = throughput.parse()
    args.batch_sizes = sizes
    res = throughput.run_throughput(args)
    rows.append({"run": i, "label": label, "keys": keys, "result": res})
    with open(out, "w") as f:
        json.dump(rows, f, indent=1, default=str)
