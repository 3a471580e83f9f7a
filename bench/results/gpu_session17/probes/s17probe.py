"""Throwaway: fold variants in one process (argv: out.json). Source probes are applied by
the shell driver to a copy of the package."""
import sys
sys.argv = [sys.argv[0]] + sys.argv[1:]
import importlib.util
spec = importlib.util.spec_from_file_location("ab", "bench/pdl_trigger_ab.py")
ab = importlib.util.module_from_spec(spec); spec.loader.exec_module(ab)
from mmserve.kernels import fused, triton_fused
from mmserve.kernels.triton_matmul import pick_config

def mk(stages=None, late=False, res_late=False):
    def nl(x, norm_weight, eps, offset, weight, bias=None, sq=None):
        if sq is None:
            return fused.norm_linear(x, norm_weight, eps, offset, weight, bias)
        m = x.numel() // x.shape[-1]
        cfg = pick_config(m, weight.shape[0])
        if stages and m <= 16: cfg = cfg._replace(stages=stages)
        return triton_fused.partials_norm_linear(x, sq, norm_weight, eps, offset, weight, bias,
                                                 config=cfg, late=late)
    def ngu(x, norm_weight, eps, offset, gate_up, sq=None):
        if sq is None:
            return fused.norm_gate_up_silu(x, norm_weight, eps, offset, gate_up)
        return fused.silu_mul(nl(x, norm_weight, eps, offset, gate_up, sq=sq))
    def lrp(x, weight, residual):
        m = x.numel() // x.shape[-1]
        n = weight.shape[0]
        sq = __import__("torch").empty(m, n // 16, dtype=__import__("torch").float32, device=x.device)
        return triton_fused._gemm(x, weight, n, None, residual=residual, sq_out=sq, late=res_late), sq
    return {"fold": True, "norm_linear": nl, "norm_gate_up_silu": ngu, "linear_residual_partials": lrp}

ab.DEFAULT["norm_linear"] = fused.norm_linear
ab.DEFAULT["linear_residual_partials"] = fused.linear_residual_partials
ab.VARIANTS = {"fold": {"fold": True}, "fold_s3": mk(3), "fold_s2": mk(2),
               "fold_reslate": mk(res_late=True), "fold_s3_reslate": mk(3, res_late=True)}
if len(sys.argv) > 2 and sys.argv[2] == "short":
    ab.VARIANTS = {"fold": {"fold": True}}
sys.argv = [sys.argv[0], sys.argv[1], "llama3-8b"]
ab.main()
