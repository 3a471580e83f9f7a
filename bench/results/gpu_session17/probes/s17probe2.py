"""Throwaway: the fold's variants (rms source x weight scaling) against the default."""
import json, statistics, sys
import torch
from mmserve.bench.engine_run import batch1_step_baseline
from mmserve.kernels import fused, triton_fused
from mmserve.models import layers, llama

EMPTY = torch.empty(0)
FOLD = {}
orig = {"norm_linear": fused.norm_linear, "norm_gate_up_silu": fused.norm_gate_up_silu,
        "linear_residual_partials": fused.linear_residual_partials,
        "linear_residual": fused.linear_residual}
orig_rp = fused.row_partials

def variant(loop, pre, res_late=False, stages=None):
    def nl(x, norm_weight, eps, offset, weight, bias=None, sq=None):
        if sq is None:
            return fused.norm_linear(x, norm_weight, eps, offset, weight, bias)
        w = FOLD[weight.data_ptr()] if pre else weight
        cfg = None
        if stages:
            cfg = triton_fused.pick_config(x.numel() // x.shape[-1], w.shape[0])._replace(stages=stages)
        return triton_fused.partials_norm_linear(x, None if loop else sq, norm_weight, eps, offset,
                                                 w, bias, prefolded=pre, config=cfg)
    def ngu(x, norm_weight, eps, offset, gate_up, sq=None):
        if sq is None:
            return fused.norm_gate_up_silu(x, norm_weight, eps, offset, gate_up)
        return fused.silu_mul(nl(x, norm_weight, eps, offset, gate_up, sq=sq))
    def lrp(x, weight, residual):
        if loop:
            return triton_fused.linear_residual(x, weight, residual, late=res_late), EMPTY
        m, n = x.numel() // x.shape[-1], weight.shape[0]
        sq = torch.empty(m, n // 16, dtype=torch.float32, device=x.device)
        return triton_fused._gemm(x, weight, n, None, residual=residual, sq_out=sq,
                                  late=res_late), sq
    return {"norm_linear": nl, "norm_gate_up_silu": ngu, "linear_residual_partials": lrp,
            "row_partials": (lambda x: EMPTY) if loop else orig_rp, "fold": True}

def use(p):
    triton_fused.SQ_EXTRA[0] = p.get("extra", 0)
    fused.set_norm_fold(bool(p.get("fold")))
    fused.row_partials = p.get("row_partials", orig_rp)
    for k, v in orig.items():
        setattr(layers, k, p.get(k, v))

VARIANTS = {"fold": variant(False, False), "fold_loop": variant(True, False),
            "fold_pre": variant(False, True), "fold_pre_loop": variant(True, True),
            "fold_pre_loop_reslate": variant(True, True, True),
            "fold_pre_loop_s3": variant(True, True, False, 3)}
for x in (8, 16, 48, 40):
    VARIANTS[f"fold_pre@{x}"] = {**variant(False, True), "extra": x}
if len(sys.argv) > 2:
    VARIANTS = {k: VARIANTS[k] for k in sys.argv[2].split(",")}
use({})
dec, first, report = batch1_step_baseline("llama3-8b")
for lay in dec.model.layers:
    for w, nw in ((lay.attn.qkv_weight, lay.input_norm), (lay.mlp.gate_up_weight, lay.post_attn_norm)):
        FOLD[w.data_ptr()] = (w.float() * nw.float()[None, :]).to(w.dtype)
torch.cuda.synchronize()
ref = report["default_row0"]
report["variants"] = {}
for label, p in VARIANTS.items():
    ratios, own, same = [], None, True
    for _ in range(3):
        use(p); v_ms, v_row0 = dec.recaptured_step_ms(first)
        use({}); b_ms, b_row0 = dec.recaptured_step_ms(first)
        own = v_row0 if own is None else own
        same &= v_row0 == own and b_row0 == ref
        ratios.append(b_ms / v_ms)
    report["variants"][label] = {"pairs": ratios, "row0": own[:8], "same": same, "v_ms": v_ms}
    print(f"  {label:<22} x{statistics.median(ratios):.4f} {[round(r, 4) for r in ratios]} same={same} row0={own[:6]} ref={ref[:6]}", flush=True)
json.dump(report, open(sys.argv[1], "w"), indent=1)
