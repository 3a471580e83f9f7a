"""The layered paged-attention kernel with its splits against one split per tile.

The keys per split (``mmserve.kernels.triton_attention.split_keys``: 128 for 64-dim
heads, 64 for 128-dim ones; the label ``split128`` below is the default either way) change
the arithmetic:
each split is an online softmax of its own, merged in order. This times the merges'
cost where every split runs in the tile's own program (the layered kernel: decode,
verify, prefill), against ``SPLIT`` larger than any context (no merge but the last),
alternated in one process. Random bf16 inputs.

Usage (GPU): ``PYTHONPATH=$PWD python bench/attention_split.py --out $OUT/attention_split.json``
"""

from __future__ import annotations

import argparse
import json

import torch

from mmserve.bench.limits import cuda_time_ms
from mmserve.kernels import triton_attention as ta
from mmserve.kernels.attention import AttentionMetadata

PAGE = 16
# name -> (query heads, kv heads, head dim, query tokens per sequence, sequences, context)
CASES = {"135m_b1_ctx300": (9, 3, 64, 1, 1, 300), "135m_b1_ctx1000": (9, 3, 64, 1, 1, 1000),
         "8b_b1_ctx1000": (32, 8, 128, 1, 1, 1000), "8b_b64_ctx1000": (32, 8, 128, 1, 64, 1000),
         "8b_verify_b4_q9_ctx1000": (32, 8, 128, 9, 4, 1000),
         "8b_prefill_2048": (32, 8, 128, 2048, 1, 2048)}


def case(hq: int, hkv: int, d: int, q: int, b: int, ctx: int):
    blocks = b * -(-ctx // PAGE)
    kc = torch.randn(blocks, PAGE, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    per = -(-ctx // PAGE)
    tables = [list(range(i * per, (i + 1) * per)) for i in range(b)]
    meta = AttentionMetadata.build([q] * b, [ctx] * b, tables, PAGE, torch.device("cuda"))
    qs = torch.randn(b * q, hq, d, device="cuda", dtype=torch.bfloat16)
    return qs, kc, vc, meta, d**-0.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="attention_split.json")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    default = ta.SPLIT, ta.SPLIT_WIDE_HEADS
    rows = {}
    for name, shape in CASES.items():
        q, kc, vc, meta, scale = case(*shape)
        times: dict[str, list[float]] = {"split128": [], "one_split": []}
        for rnd in range(args.rounds):
            for label in (("split128", "one_split") if rnd % 2 == 0 else ("one_split", "split128")):
                ta.SPLIT, ta.SPLIT_WIDE_HEADS = (default if label == "split128"
                                                 else (1 << 30, 1 << 30))
                def call(q=q, kc=kc, vc=vc, meta=meta, scale=scale) -> None:
                    ta.cuda_paged_attention(q, kc, vc, meta, scale)

                call()  # compile outside the timing
                times[label].append(1e3 * cuda_time_ms(call, repeats=20))
        ta.SPLIT, ta.SPLIT_WIDE_HEADS = default
        rows[name] = {"shape": shape, **times,
                      "ratio": min(times["split128"]) / min(times["one_split"])}
        print(f"{name:26s} split128 {min(times['split128']):9.1f} us  one split "
              f"{min(times['one_split']):9.1f} us  ratio {rows[name]['ratio']:.3f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
