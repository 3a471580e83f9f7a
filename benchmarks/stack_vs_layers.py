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

Usage (GPU):
``PYTHONPATH=$PWD python benchmarks/stack_vs_layers.py --steps 160 --out $OUT/svl.json``
(CPU, a smoke run under Triton's interpreter: ``TRITON_INTERPRET=1 ... --device cpu
--layers 1 --steps 2 --batch 2``; float32 there, so nothing is expected to be equal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import asdict, replace

import torch

from mmserve.bench.shapes import shape
from mmserve.engine.cuda_graphs import serial_max_keys
from mmserve.kernels import settings as kernel_settings
from mmserve.kernels.attention import AttentionMetadata, kv_layer, paged_attention
from mmserve.kernels.decode_stack import serial_splits, stacked_weights
from mmserve.kernels.fused import linear_residual, norm_gate_up_silu, norm_linear, qkv_rope
from mmserve.kernels.triton_attention import paged_metadata
from mmserve.kernels.triton_decode_stack import decode_stack
from mmserve.models.llama import hf_tensor_shapes
from mmserve.models.registry import build_model

PAGE = 16
PROMPT = 128


def random_model(name: str, layers: int | None, device: str, dtype: torch.dtype):
    """The shape with ``layers`` layers and HF-style random weights (normal, std 0.02;
    norms 1) -> (model, config)."""
    cfg = shape(name)
    if layers:
        cfg["num_hidden_layers"] = layers
    shapes = hf_tensor_shapes(cfg)
    gen = torch.Generator(device=device).manual_seed(0)
    sd = {
        k: (
            torch.ones(v, device=device)
            if len(v) == 1
            else torch.randn(v, generator=gen, device=device) * 0.02
        )
        for k, v in shapes.items()
    }
    return build_model(cfg, sd, dtype, device), cfg


def step_meta(lens: list[int], tables: torch.Tensor, device) -> AttentionMetadata:
    """One new token for each sequence ``i`` at position ``lens[i] - 1``."""
    return AttentionMetadata.build([1] * len(lens), lens, tables.tolist(), PAGE, device)


def layered(model, x, positions, meta, kv) -> torch.Tensor:
    for i, layer in enumerate(model.layers):
        x = layer(x, positions, model.rope, meta, kv_layer(kv, i))
    return x


def stacked(model, x, positions, meta, kv, scratch=None) -> torch.Tensor:
    pm = paged_metadata(meta, PAGE)
    return decode_stack(
        x,
        stacked_weights(model.layers),
        kv,
        model.rope.cos,
        model.rope.sin,
        positions,
        pm.slot_mapping,
        pm.block_tables,
        pm.context_lens,
        pm.query_start,
        pm.query_lens,
        1,
        heads=model.num_heads,
        kv_heads=model.num_kv_heads,
        eps=model.eps,
        scale=model.head_dim**-0.5,
        programs=None if kv.is_cuda else 1,
        scratch=scratch,
    )


def probe(model, positions, meta, kv_pre, kv_stack, sc, serial: bool) -> list[dict]:
    """Where a stack launch departs: each layer's phases redone by the layered kernels on
    the stack's own inputs (``sc``: its intermediates, ``kv_stack``: its cache after the
    launch, ``kv_pre``: the cache before it), compared bit for bit with what the stack
    wrote. The layers with a phase that differs, first one first."""
    found = []
    for i, layer in enumerate(model.layers):
        a, m, xi = layer.attn, layer.mlp, sc["xs"][i]
        res: dict = {"layer": i}
        qkv = norm_linear(xi, layer.input_norm, model.eps, 0.0, a.qkv_weight)
        if "qkv" in sc:  # (with rope in the stack's QKV phase, its rotated q: below)
            res["qkv"] = torch.equal(qkv, sc["qkv"][i])
        attn = {}
        for name, mode in (
            ("attn_spread", contextlib.nullcontext()),
            ("attn_serial", serial_splits()),
        ):
            kvc = kv_pre.clone()
            with mode:
                attn[name] = a.attend(qkv, positions, model.rope, meta, kv_layer(kvc, i))
            res[name] = torch.equal(attn[name], sc["attn"][i])
            res[name + "_kv"] = torch.equal(kvc[i], kv_stack[i])
        # the reference layer's own route: rope in the QKV product's epilogue, then the
        # paged attention kernel (from the stack's input of the layer)
        kvc = kv_pre.clone()
        with serial_splits() if serial else contextlib.nullcontext():
            q = qkv_rope(
                xi,
                layer.input_norm,
                model.eps,
                0.0,
                a.qkv_weight,
                a.qkv_bias,
                a.heads,
                a.kv_heads,
                positions,
                model.rope,
                kv_layer(kvc, i),
                meta.slot_mapping,
            )
            if q is not None and "qrot" in sc:
                res["qrot"] = torch.equal(q.reshape(sc["qrot"][i].shape), sc["qrot"][i])
            if q is not None:
                attn["attn_qkv_rope"] = paged_attention(
                    q, kv_layer(kvc, i), meta, a.scale, a.window
                ).reshape(-1, a.q_size)
                res["attn_qkv_rope"] = torch.equal(attn["attn_qkv_rope"], sc["attn"][i])
                res["attn_qkv_rope_kv"] = torch.equal(kvc[i], kv_stack[i])
        res["attn_max_abs_diff"] = {
            k: float((v.float() - sc["attn"][i].float()).abs().max()) for k, v in attn.items()
        }
        res["o_residual"] = torch.equal(
            linear_residual(sc["attn"][i], a.o_weight, xi), sc["mids"][i]
        )
        res["gate_up_silu"] = torch.equal(
            norm_gate_up_silu(
                sc["mids"][i], layer.post_attn_norm, model.eps, 0.0, m.gate_up_weight
            ),
            sc["act"][i],
        )
        res["down_residual"] = torch.equal(
            linear_residual(sc["act"][i], m.down_weight, sc["mids"][i]), sc["xs"][i + 1]
        )
        if not all(v for k, v in res.items() if isinstance(v, bool)):
            found.append(res)
    return found


def compare(name: str, got, kv_got, want, kv_want, logits_want, model, row=0) -> dict:
    """Where ``got`` (its row ``row``) and its cache differ from the reference."""
    g = got[row : row + 1]
    layers = [i for i in range(kv_want.shape[0]) if not torch.equal(kv_got[i], kv_want[i])]
    return {
        "path": name,
        "hidden_equal": bool(torch.equal(g, want)),
        "max_abs_diff": float((g.float() - want.float()).abs().max()),
        "first_kv_layer_differing": layers[0] if layers else None,
        "argmax_equal": bool(
            model.compute_logits(g).argmax(-1).item() == logits_want.argmax(-1).item()
        ),
    }


def interpreter_index_patch() -> None:
    """Under Triton 3.6's interpreter with numpy >= 2.4, the work-around of
    tests/kernels/conftest.py: a scalar argument is a 1-element array, read its element."""
    from triton.runtime import interpreter

    real = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        real(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=None, help="default: the shape's")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=2, help="stack launches a step")
    ap.add_argument("--batch", type=int, default=64, help="rows of the batched step (0: none)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="stack_vs_layers.json")
    ap.add_argument("--tuning", default="", help="StackTuning changes, e.g. qkv_rope=0,bk=128")
    ap.add_argument(
        "--probe",
        action="store_true",
        help="at a step the stack differs, name the layer and phase (probe())",
    )
    ap.add_argument(
        "--serial-ref",
        action="store_true",
        help="also the layered one-row step with serial splits against the reference",
    )
    args = ap.parse_args()
    base = kernel_settings.current().stack
    changes = {}
    for kv_pair in filter(None, args.tuning.split(",")):
        k, v = kv_pair.split("=")
        old = getattr(base, k)
        changes[k] = type(old)(int(v)) if isinstance(old, (bool, int)) else v
    kernel_settings.install(replace(kernel_settings.current(), stack=replace(base, **changes)))
    if args.device == "cpu":
        interpreter_index_patch()
    result = check(
        args.model,
        args.layers,
        args.steps,
        args.repeat,
        args.batch,
        args.device,
        probe_steps=args.probe,
        serial_ref=args.serial_ref,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


@torch.inference_mode()
def check(
    name: str,
    layers: int | None,
    steps: int,
    repeat: int,
    batch: int,
    device: str,
    probe_steps: bool = False,
    serial_ref: bool = False,
    log=print,
) -> dict:
    """The comparison of the module docstring -> a report: ``differing_steps`` (the steps
    where any path differs from the reference) and a row a step."""
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model, cfg = random_model(name, layers, device, dtype)
    seqs = max(1, batch)
    per = -(-(PROMPT + steps) // PAGE)
    kv = torch.zeros(
        model.num_layers,
        2,
        1 + seqs * per,
        PAGE,
        model.num_kv_heads,
        model.head_dim,
        dtype=dtype,
        device=dev,
    )
    tables = 1 + torch.arange(seqs * per).view(seqs, per)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg["vocab_size"], (PROMPT,), generator=gen)
    # the prompt into every sequence's blocks (one layered prefill of all of them)
    meta = AttentionMetadata.build([PROMPT] * seqs, [PROMPT] * seqs, tables.tolist(), PAGE, dev)
    pos = torch.arange(PROMPT, device=dev).repeat(seqs)
    layered(model, model.embed(prompt.to(dev).repeat(seqs)), pos, meta, kv)
    tokens = torch.randint(0, cfg["vocab_size"], (steps,), generator=gen).tolist()
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
        for r in range(repeat):
            kv_s = kv.clone()
            sc: dict = {}
            with serial_splits() if serial else contextlib.nullcontext():
                got = stacked(model, x1, pos1, meta1, kv_s, sc)
            row["checks"].append(
                compare(
                    f"stack#{r}",
                    got,
                    kv_s[:, :, : 1 + per],
                    want,
                    kv_ref[:, :, : 1 + per],
                    logits,
                    model,
                )
            )
            c = row["checks"][-1]
            if (
                probe_steps
                and r == 0
                and not (c["hidden_equal"] and c["first_kv_layer_differing"] is None)
            ):
                row["probe"] = probe(model, pos1, meta1, kv, kv_s, sc, serial)
                log(f"step {s} probe: {json.dumps(row['probe'][:2])}", flush=True)
        if serial_ref:
            kv_l = kv.clone()
            with serial_splits():
                got = layered(model, x1, pos1, meta1, kv_l)
            row["checks"].append(
                compare(
                    "layers-serial",
                    got,
                    kv_l[:, :, : 1 + per],
                    want,
                    kv_ref[:, :, : 1 + per],
                    logits,
                    model,
                )
            )
        if batch > 0:
            kv_b = kv.clone()
            posb = pos1.repeat(seqs)
            got = layered(
                model, x1.repeat(seqs, 1), posb, step_meta([ctx] * seqs, tables, dev), kv_b
            )
            row["checks"].append(
                compare(
                    f"batch{seqs}",
                    got,
                    kv_b[:, :, : 1 + per],
                    want,
                    kv_ref[:, :, : 1 + per],
                    logits,
                    model,
                )
            )
        # every path goes on from the reference's bytes (the batch's other sequences, which
        # hold the same prompt and tokens, from their own step)
        if batch > 0:
            kv_b[:, :, : 1 + per] = kv_ref[:, :, : 1 + per]
            kv_ref = kv_b
        kv = kv_ref
        bad = [
            c
            for c in row["checks"]
            if not (c["hidden_equal"] and c["first_kv_layer_differing"] is None)
        ]
        if bad:
            differing.append(s)
            log(
                f"step {s} (ctx {ctx}): "
                + "; ".join(
                    f"{c['path']} hidden {'=' if c['hidden_equal'] else '!='} "
                    f"(max {c['max_abs_diff']:.3g}), first kv layer differing "
                    f"{c['first_kv_layer_differing']}, argmax "
                    f"{'same' if c['argmax_equal'] else 'DIFFERS'}"
                    for c in bad
                ),
                flush=True,
            )
        rows.append(row)
    log(
        f"{name} ({model.num_layers} layers): {len(differing)} of {steps} steps "
        f"differ from the layered one-row step; first {differing[:10]}",
        flush=True,
    )
    return {
        "model": name,
        "layers": model.num_layers,
        "steps": steps,
        "tuning": asdict(kernel_settings.current().stack),
        "batch": batch,
        "repeat": repeat,
        "differing_steps": differing,
        "rows": rows,
    }


if __name__ == "__main__":
    main()
