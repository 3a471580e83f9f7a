"""Session 35: why q8_linear's bits differ from the bf16 GEMM's on the H200 (s35a's tests).
Which tiles of the bf16 GEMM agree with each other, which of q8_linear's, and whether the
kernel's dequantized operand is the weight (one-hot rows)."""
import torch
import triton

from mmserve.kernels.q8 import quantize_q8
from mmserve.kernels.triton_matmul import TileConfig, invariant_linear, q8_linear

print("triton", triton.__version__, "torch", torch.__version__)
torch.manual_seed(0)
n, k = 4096, 576
w8 = quantize_q8(torch.randn(n, k) / k**0.5).cuda()
w = w8.dequantize(torch.bfloat16)
x = torch.randn(16, k).cuda().bfloat16()
ref = invariant_linear(x, w, float_out=True)
exact = (x.double() @ w.double().T)


def cmp(name, y):
    d = y != ref
    print(f"{name:48s} differ {int(d.sum()):6d}  max {float((y - ref).abs().max()):.3g}"
          f"  err-vs-fp64 {float((y.double() - exact).abs().mean()):.4g}")


print("default tile err-vs-fp64", float((ref.double() - exact).abs().mean()))
for cfg in [TileConfig(16, 128, 32, 4, 8), TileConfig(16, 128, 64, 4, 5),
            TileConfig(16, 16, 256, 2, 4), TileConfig(64, 64, 32, 4, 3),
            TileConfig(16, 128, 128, 4, 3), TileConfig(16, 32, 16, 4, 3)]:
    cmp(f"bf16 {tuple(cfg)}", invariant_linear(x, w, config=cfg, float_out=True))
for cfg in [TileConfig(16, 128, 32, 4, 8), TileConfig(16, 64, 32, 4, 4),
            TileConfig(64, 64, 32, 4, 3), TileConfig(16, 128, 32, 4, 1)]:
    cmp(f"q8 {tuple(cfg)}", q8_linear(x, w8, config=cfg, float_out=True))
e = torch.zeros(16, k, device="cuda", dtype=torch.bfloat16)
cols = torch.arange(16) * 7
e[torch.arange(16), cols] = 1
y = q8_linear(e, w8, float_out=True)
print("one-hot rows: q8 columns != weight", int((y != w[:, cols].T.float()).sum()))
y2 = invariant_linear(e, w, float_out=True)
print("one-hot rows: bf16 columns != weight", int((y2 != w[:, cols].T.float()).sum()))
# a single K block (k = 32): the chain is two k16 steps in both kernels
w8s = quantize_q8(torch.randn(256, 32)).cuda()
ws = w8s.dequantize(torch.bfloat16)
xs = torch.randn(16, 32).cuda().bfloat16()
a = invariant_linear(xs, ws, config=TileConfig(16, 128, 32, 4, 1), float_out=True)
b = q8_linear(xs, w8s, config=TileConfig(16, 128, 32, 4, 1), float_out=True)
print("k=32, one step: differ", int((a != b).sum()))
# q8 kernel fed back the dequantized weight (the same operand bits) through its fp32 path
wq = w8.dequantize(torch.float32)
print("dequantize(fp32) == bf16 weight as float", bool(torch.equal(wq.bfloat16(), w)))
