"""Session 22: the stack's attention output with q_regs on and off, at the steps and
layers where stack_vs_layers.py --probe saw it depart (SmolLM2-135M widths, random
weights, teacher-forced as there), against a float64 attention over the same cache and
the same rotated queries, and against that attention with the step's own key and value
left at zero (what a read before the write lands would see). Ran before q_regs was
removed (it sets TUNING["q_regs"], which no longer exists)."""
import json
import sys

import torch

sys.path.insert(0, "bench")
import stack_vs_layers as svl  # noqa: E402
from mmserve.kernels.attention import kv_layer  # noqa: E402
from mmserve.kernels.decode_stack import serial_splits  # noqa: E402
from mmserve.kernels.fused import qkv_rope  # noqa: E402
from mmserve.kernels.triton_decode_stack import TUNING  # noqa: E402

WANT = {61: 8, 69: 11, 98: 11, 113: 4}  # step -> layer (start 2's probe)


def attention64(q, kc, vc, ctx, group, scale, zero_last=False):
    """q (Hq, D) bf16; kc/vc (ctx, Hkv, D) -> (Hq, D) float64."""
    k, v = kc.double().clone(), vc.double().clone()
    if zero_last:
        k[ctx - 1] = 0
        v[ctx - 1] = 0
    out = []
    for h in range(q.shape[0]):
        s = (k[:, h // group] @ q[h].double()) * scale
        p = torch.softmax(s, 0)
        out.append(p @ v[:, h // group])
    return torch.stack(out)


@torch.inference_mode()
def main():
    dev = "cuda"
    model, cfg = svl.random_model("smollm2-135m", None, dev, torch.bfloat16)
    seqs, steps = 1, max(WANT) + 1
    per = -(-(svl.PROMPT + steps) // svl.PAGE)
    kv = torch.zeros(model.num_layers, 2, 1 + 64 * per, svl.PAGE, model.num_kv_heads,
                     model.head_dim, dtype=torch.bfloat16, device=dev)
    tables = 1 + torch.arange(64 * per).view(64, per)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg["vocab_size"], (svl.PROMPT,), generator=gen)
    # as stack_vs_layers.py (batch 64 prefill, so the same cache bytes and generator draws)
    meta = svl.AttentionMetadata.build([svl.PROMPT] * 64, [svl.PROMPT] * 64, tables.tolist(),
                                       svl.PAGE, dev)
    pos = torch.arange(svl.PROMPT, device=dev).repeat(64)
    svl.layered(model, model.embed(prompt.to(dev).repeat(64)), pos, meta, kv)
    tokens = torch.randint(0, cfg["vocab_size"], (160,), generator=gen).tolist()
    report = []
    for s in range(steps):
        ctx = svl.PROMPT + s + 1
        pos1 = torch.tensor([ctx - 1], device=dev)
        x1 = model.embed(torch.tensor([tokens[s]], device=dev))
        meta1 = svl.step_meta([ctx], tables[:1], dev)
        if s in WANT:
            L = WANT[s]
            a = model.layers[L].attn
            row = {"step": s, "ctx": ctx, "layer": L}
            outs = {}
            for qr in (True, False):
                TUNING["q_regs"] = qr
                kv_s, sc = kv.clone(), {}
                with serial_splits():
                    svl.stacked(model, x1, pos1, meta1, kv_s, sc)
                outs[f"stack_q_regs_{int(qr)}"] = sc["attn"][L].view(a.heads, -1)
                xl = sc["xs"][L]
            TUNING["q_regs"] = True
            kv_r = kv.clone()
            q = qkv_rope(xl, model.layers[L].input_norm, model.eps, 0.0, a.qkv_weight, None,
                         a.heads, a.kv_heads, pos1, model.rope, kv_layer(kv_r, L),
                         meta1.slot_mapping)
            kvl = kv_r[L]  # (2, blocks, page, Hkv, D)
            blocks = tables[0, : -(-ctx // svl.PAGE)].to(dev)
            kc = kvl[0][blocks].reshape(-1, a.kv_heads, a.head_dim)[:ctx]
            vc = kvl[1][blocks].reshape(-1, a.kv_heads, a.head_dim)[:ctx]
            with serial_splits():
                outs["layered_serial"] = a.attend(sc["qkv"][L], pos1, model.rope, meta1,
                                                  kv_layer(kv.clone(), L)).view(a.heads, -1)
            outs["layered"] = a.attend(sc["qkv"][L], pos1, model.rope, meta1,
                                       kv_layer(kv.clone(), L)).view(a.heads, -1)
            ref = attention64(q[0], kc, vc, ctx, a.heads // a.kv_heads, a.scale)
            ref0 = attention64(q[0], kc, vc, ctx, a.heads // a.kv_heads, a.scale, True)
            for name, o in outs.items():
                row[name] = {"err_vs_f64": float((o.double() - ref).abs().max()),
                             "err_vs_f64_without_new_key": float((o.double() - ref0).abs().max()),
                             "elements_differing_from_layered":
                                 int((o != outs["layered"]).sum()),
                             "heads_differing": sorted({int(h) for h in
                                                        (o != outs["layered"]).nonzero()[:, 0]})}
            print(json.dumps(row), flush=True)
            report.append(row)
        kv_ref = kv.clone()
        svl.layered(model, x1, pos1, meta1, kv_ref)
        kv = kv_ref
    json.dump(report, open(sys.argv[1], "w"), indent=1)


main()
