"""The one-launch decode stack against the layered kernels at a real model's widths, step by
step, and the layered step of one row against the same row in a batch (GPU).

Batch invariance says a row's logits do not depend on which path ran its step or on the
rows beside it; the kernel tests check it on narrow models (widths 64-256). This runs a
named shape (``mmserve.bench.shapes``, random weights, ``--layers`` of them) after a
128-token prompt and teacher-forces ``--steps`` decode steps (tokens from a fixed
generator, not the argmax, so a difference never compounds). Each step, from the same
cache bytes:

- ``layers``: every layer's kernels for the one row (the reference), on a copy of the cache;
- ``stack``: the one launch (its serial-split variant while the graphs would replay it),
  ``--repeat`` times on copies (a race shows as launches that differ from each other);
- ``batch``: the layered kernels for ``--batch`` sequences holding the same prompt and the
  same token (row 0 against the reference).

Each is compared bit for bit with the reference: the last hidden state, each layer's
cache bytes (the first layer that differs says where a difference starts) and the
logits' argmax. The cache then takes the reference's bytes. Prints and writes the steps
that differ.

Usage (GPU): ``PYTHONPATH=$PWD python bench/stack_vs_layers.py --steps 160 --out $OUT/svl.json``
(CPU, a smoke run under Triton's interpreter: ``TRITON_INTERPRET=1 ... --device cpu
--layers 1 --steps 2 --batch 2``; float32 there, so nothing is expected to be equal).
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from mmserve.bench.shapes import shape
from mmserve.engine.cuda_graphs import serial_max_keys
from mmserve.kernels.attention import AttentionMetadata, kv_layer
from mmserve.kernels.decode_stack import serial_splits, stacked_weights
from mmserve.kernels.triton_attention import paged_metadata
from mmserve.kernels.triton_decode_stack import decode_stack
from mmserve.models.registry import build_model

PAGE = 16
PROMPT = 128


def random_model(name: str, layers: int | None, device: str, dtype: torch.dtype):
    """The shape with ``layers`` layers and HF-style random weights (normal, std 0.02;
    norms 1) -> (model, config)."""
    cfg = shape(name)
    if layers:
        cfg["num_hidden_layers"] = layers
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
                   f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q),
                   f"{p}.mlp.gate_proj.weight": (inter, h), f"{p}.mlp.up_proj.weight": (inter, h),
                   f"{p}.mlp.down_proj.weight": (h, inter), f"{p}.input_layernorm.weight": (h,),
                   f"{p}.post_attention_layernorm.weight": (h,)}
    gen = torch.Generator(device=device).manual_seed(0)
    sd = {k: (torch.ones(v, device=device) if len(v) == 1 else
              torch.randn(v, generator=gen, device=device) * 0.02) for k, v in shapes.items()}
    return build_model(cfg, sd, dtype, device), cfg


def step_meta(lens: list[int], tables: torch.Tensor, device) -> AttentionMetadata:
    """One new token for each sequence ``i`` at position ``lens[i] - 1``."""
    return AttentionMetadata.build([1] * len(lens), lens, tables.tolist(), PAGE, device)


def layered(model, x, positions, meta, kv) -> torch.Tensor:
    for i, layer in enumerate(model.layers):
        x = layer(x, positions, model.rope, meta, kv_layer(kv, i))
    return x


def stacked(model, x, positions, meta, kv) -> torch.Tensor:
    pm = paged_metadata(meta, PAGE)
    return decode_stack(x, stacked_weights(model.layers), kv, model.rope.cos, model.rope.sin,
                        positions, pm.slot_mapping, pm.block_tables, pm.context_lens,
                        pm.query_start, pm.query_lens, 1, heads=model.num_heads,
                        kv_heads=model.num_kv_heads, eps=model.eps,
                        scale=model.head_dim**-0.5, programs=None if kv.is_cuda else 1)


def compare(name: str, got, kv_got, want, kv_want, logits_want, model, row=0) -> dict:
    """Where ``got`` (its row ``row``) and its cache differ from the reference."""
    g = got[row:row + 1]
    layers = [i for i in range(kv_want.shape[0]) if not torch.equal(kv_got[i], kv_want[i])]
    return {"path": name, "hidden_equal": bool(torch.equal(g, want)),
            "max_abs_diff": float((g.float() - want.float()).abs().max()),
            "first_kv_layer_differing": layers[0] if layers else None,
            "argmax_equal": bool(model.compute_logits(g).argmax(-1).item()
                                 == logits_want.argmax(-1).item())}


def interpreter_index_patch() -> None:
    """Under Triton 3.6's interpreter with numpy >= 2.4, the work-around of
    tests/kernels/conftest.py: a scalar argument is a 1-element array, read its element."""
    from triton.runtime import interpreter

    real = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        real(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=None, help="default: the shape's")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=2, help="stack launches a step")
    ap.add_argument("--batch", type=int, default=64, help="rows of the batched step (0: none)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="stack_vs_layers.json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cpu":
        interpreter_index_patch()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model, cfg = random_model(args.model, args.layers, args.device, dtype)
    seqs = max(1, args.batch)
    per = -(-(PROMPT + args.steps) // PAGE)
    kv = torch.zeros(model.num_layers, 2, 1 + seqs * per, PAGE, model.num_kv_heads,
                     model.head_dim, dtype=dtype, device=dev)
    tables = 1 + torch.arange(seqs * per).view(seqs, per)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg["vocab_size"], (PROMPT,), generator=gen)
    # the prompt into every sequence's blocks (one layered prefill of all of them)
    meta = AttentionMetadata.build([PROMPT] * seqs, [PROMPT] * seqs, tables.tolist(), PAGE, dev)
    pos = torch.arange(PROMPT, device=dev).repeat(seqs)
    layered(model, model.embed(prompt.to(dev).repeat(seqs)), pos, meta, kv)
    tokens = torch.randint(0, cfg["vocab_size"], (args.steps,), generator=gen).tolist()
    rows, differing = [], []
    for s, tok in enumerate(tokens):
        ctx = PROMPT + s + 1
        pos1 = torch.tensor([ctx - 1], device=dev)
        x1 = model.embed(torch.tensor([tok], device=dev))
        meta1 = step_meta([ctx], tables[:1], dev)
        kv_ref = kv.clone()
        want = layered(model, x1, pos1, meta1, kv_ref)
        logits = model.compute_logits(want)
        row = {"step": s, "ctx": ctx, "checks": []}
        serial = ctx <= serial_max_keys(model.head_dim)
        for r in range(args.repeat):
            kv_s = kv.clone()
            with serial_splits() if serial else contextlib.nullcontext():
                got = stacked(model, x1, pos1, meta1, kv_s)
            row["checks"].append(compare(f"stack#{r}", got, kv_s[:, :, :1 + per], want,
                                         kv_ref[:, :, :1 + per], logits, model))
        if args.batch > 0:
            kv_b = kv.clone()
            posb = pos1.repeat(seqs)
            got = layered(model, x1.repeat(seqs, 1), posb, step_meta([ctx] * seqs, tables, dev),
                          kv_b)
            row["checks"].append(compare(f"batch{seqs}", got, kv_b[:, :, :1 + per], want,
                                         kv_ref[:, :, :1 + per], logits, model))
        # every path goes on from the reference's bytes (the batch's other sequences, which
        # hold the same prompt and tokens, from their own step)
        if args.batch > 0:
            kv_b[:, :, :1 + per] = kv_ref[:, :, :1 + per]
            kv_ref = kv_b
        kv = kv_ref
        bad = [c for c in row["checks"] if not (c["hidden_equal"]
                                                and c["first_kv_layer_differing"] is None)]
        if bad:
            differing.append(s)
            print(f"step {s} (ctx {ctx}): " + "; ".join(
                f"{c['path']} hidden {'=' if c['hidden_equal'] else '!='} "
                f"(max {c['max_abs_diff']:.3g}), first kv layer differing "
                f"{c['first_kv_layer_differing']}, argmax "
                f"{'same' if c['argmax_equal'] else 'DIFFERS'}" for c in bad), flush=True)
        rows.append(row)
    print(f"{args.model} ({model.num_layers} layers): {len(differing)} of {args.steps} steps "
          f"differ from the layered one-row step; first {differing[:10]}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "layers": model.num_layers, "steps": args.steps,
                   "batch": args.batch, "repeat": args.repeat, "differing_steps": differing,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
