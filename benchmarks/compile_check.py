"""Compile the stack, attention and GEMM kernels for sm_90 without a GPU: registers and spills.

The pip Triton carries ptxas, so a machine without CUDA can run the front end (which
catches errors the interpreter lets through, e.g. a plain global read in a jitted
function) and ptxas (registers, stack frame, spill bytes), at no device time. Integer
arguments and pointers get the JIT's divisibility-by-16 hint where the engine's values
have it (without it, the loads do not vectorise and the counts mean nothing); the shape
is SmolLM2-135M's.

Usage (CPU): ``python benchmarks/compile_check.py`` (needs ``pip install triton``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget, Language
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend

from mmserve.kernels import (
    triton_attention,
    triton_decode_stack,
    triton_fused,
    triton_grid,
    triton_matmul,
    triton_rope_attention,
)

TARGET = GPUTarget("cuda", 90, 32)
NO_HINT = {
    "L",
    "M",
    "B",
    "att_tiles",
    "groups",
    "SPLITS",
    "PER",
    "eps",
    "scale_log2",
    "stride_sb",
    "stride_ss",
}
STACK = dict(
    H=576,
    HQ=9,
    HKV=3,
    D=64,
    INTER=1536,
    PAGE=16,
    P=96,
    BN=16,
    BK=256,
    BKG=64,
    CH=64,
    UNROLL=9,
    ROUND=1,
    TK=16,
    ATT_BM=16,
    ATT_BN=128,
    SPLIT=128,
    TIMING=False,
    WORKERS=48,
    LINE=64,
    LQKV=256,
    LO=64,
    LGU=512,
    LD=256,
    LN=1,
    KV_ROWS=64,
    KV_LINES=4,
    ATT_PREFETCH=1,
    SPREAD=True,
    ONE_DOT=True,
    QKV_ROPE=True,
    EARLY=True,
    BKH=64,
    BKQ=64,
    DEFER=True,
    G=36,
    GP=64,
    KS=5,
    ATT_STAGES=1,
    V_L1=False,
    KT=False,
    QKV_HOIST=True,
    PDL=True,
    POLL="",
)
ATTENTION = dict(
    G=3, D=64, PAGE=16, WINDOW=0, BM=16, BN=128, SPLIT=128, FP8=False, PREFETCH=1, PDL=True
)
GEMM = dict(HAS_BIAS=False, BM=16, BN=16, BK=256, GROUP_M=8, PDL=True, LATE=False)  # thin tile
FUSED = dict(NORM=False, RESIDUAL=False, GATED=False, ROUND=1, CH=64, UNROLL=8, **GEMM)


def _types(fn, constexprs: dict, fp8: bool = False) -> dict[str, str]:
    types = {}
    for name in fn.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name in ("pos_ptr", "slot_ptr", "qstart_ptr", "qlen_ptr", "ctx_ptr", "timing_ptr"):
            types[name] = "*i64"
        elif name in ("tables_ptr", "counter_ptr", "count_ptr"):
            types[name] = "*i32"
        elif name in (
            "part_ptr",
            "cos_ptr",
            "sin_ptr",
            "ks_ptr",
            "vs_ptr",
            "ps_ptr",
            "psi_ptr",
            "psm_ptr",
        ):
            types[name] = "*fp32"
        elif name == "q_ptr" and "s_ptr" in fn.arg_names:  # the Q8_0 head's values (the
            # attention kernels' q_ptr is bf16), its scales "s_ptr" float32
            types[name] = "*i8"
        elif name == "s_ptr":
            types[name] = "*fp32"
        elif name.endswith("_ptr"):
            types[name] = "*fp8e4nv" if fp8 and name in ("k_ptr", "v_ptr") else "*bf16"
        elif name in ("eps", "scale_log2", "offset"):
            types[name] = "fp32"
        else:
            types[name] = "i32"
    return types


def _source(fn, constexprs: dict, fp8: bool) -> ASTSource:
    types = _types(fn, constexprs, fp8)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if types[n] != "constexpr" and n not in NO_HINT
    }
    return ASTSource(fn, signature=types, constexprs=constexprs, attrs=attrs)


def compile_sm90(fn, constexprs: dict, fp8: bool = False, **options):
    """``fn`` compiled for sm_90 with ``constexprs`` (the JIT's divisibility hints)."""
    return triton.compile(_source(fn, constexprs, fp8), target=TARGET, options=options)


def ttgir_sm90(fn, constexprs: dict, fp8: bool = False, **options) -> str:
    """``fn``'s sm_90 TTGIR, the text ``compile_sm90(...).asm["ttgir"]`` holds, without the
    LLVM, PTX and ptxas stages after it (most of a compile's time; the layouts are fixed by
    then). Runs the backend's own first two stages, so the passes are the compiler's."""
    backend = make_backend(TARGET)
    opts = backend.parse_options(dict(options))
    stages: dict = {}
    backend.add_stages(stages, opts, Language.TRITON)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = _source(fn, constexprs, fp8).make_ir(
        TARGET, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context
    )
    metadata: dict = {}
    for stage in ("ttir", "ttgir"):
        module = stages[stage](module, metadata)
    return str(module)


def dot_layouts(fn, constexprs: dict, fp8: bool = False, **options) -> list[tuple[str, ...]]:
    """Each dot of ``fn``'s sm_90 TTGIR as (MMA version, instruction shape, then the kWidth
    of each operand held in registers; wgmma's operands in shared memory have none). Two
    products give the same bits only if they send the same k to the same k16 instruction:
    the same kWidth where mma.sync reads registers (an int8 load's kWidth 4 regroups k, so
    a Q8 product read that way is an ulp off the bf16 GEMM's). mma.sync (16-row tiles) and
    wgmma (64 rows and more) add a k16 step alike (docs/performance.md)."""
    text = ttgir_sm90(fn, constexprs, fp8, **options)
    mmas = {}
    for name, body in re.findall(r"^(#\w+) = #ttg\.nvidia_mma<(.*)>$", text, re.M):
        version = re.search(r"versionMajor = (\d+)", body)
        shape = re.search(r"instrShape = \[([\d, ]+)\]", body)
        mmas[name] = (version.group(1) if version else "?", shape.group(1) if shape else "?")
    out = []
    for line in text.splitlines():
        if "tt.dot " not in line and "ttng.warp_group_dot " not in line:
            continue
        result = re.search(r"-> tensor<[^,>]+, (#\w+)>", line)
        ops = re.findall(r"dot_op<\{opIdx = (\d), parent = #\w+, kWidth = (\d+)\}>", line)
        out.append(
            (*mmas.get(result.group(1) if result else "", ("?", "?")), *(k for _, k in sorted(ops)))
        )
    return out


def report(fn, constexprs: dict, fp8: bool = False, **options) -> str:
    """ptxas' line for ``fn`` compiled with ``constexprs``: registers, spills."""
    compiled = compile_sm90(fn, constexprs, fp8, **options)
    ptx = compiled.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    return (
        f"{regs.group(1) if regs else '?'} registers, "
        f"{spill.group(1) if spill else '?'} B spilled, "
        f"{compiled.metadata.shared // 1024} kB shared"
    )


def forms() -> list[tuple[str, object, dict, bool, dict]]:
    """(label, kernel, constexprs, fp8, compile options): every form this check compiles."""
    out: list[tuple[str, object, dict, bool, dict]] = []

    def add(label, fn, constexprs, fp8=False, **options):
        out.append((label, fn, constexprs, fp8, options))

    stack = dict(num_warps=4, num_stages=4)
    kernel = triton_decode_stack._decode_stack_kernel
    # the serial kernel's defaults (StackTuning's "serial" switches: k_t, v_l1)
    serial = {**STACK, "SPREAD": False, "KT": True, "V_L1": True}
    for spread in (True, False):
        add(f"decode stack, spread={spread}", kernel, (STACK if spread else serial), **stack)
    for spread in (True, False):
        add(
            f"decode stack, the barrier's wait as 4 relaxed loads in flight, spread={spread}",
            kernel,
            {**(STACK if spread else serial), "POLL": triton_grid.poll_asm(4, 100, False)},
            **stack,
        )
    add(
        "decode stack, the K loops at the kernel's 4 stages (gemm_stages off)",
        kernel,
        {**STACK, "KS": 0},
        **stack,
    )
    add(
        "decode stack, the norm from the rows (defer off)",
        kernel,
        {**STACK, "DEFER": False},
        **stack,
    )
    add(
        "decode stack's input kernel",
        triton_decode_stack._stack_input_kernel,
        {"GP": 64, "IDS": True, "ZB": 256, "TRIGGER": True},
        num_warps=4,
    )
    add(
        "decode stack, serial, loads after the products (early off)",
        kernel,
        {**serial, "EARLY": False},
        **stack,
    )
    add(
        "decode stack, serial, K steps of 256 where K = 576 (bk_exact off)",
        kernel,
        {**serial, "BKH": 256, "BKQ": 256, "BKG": 256},
        **stack,
    )
    add(
        "decode stack, serial, gate and up as two products",
        kernel,
        {**serial, "ONE_DOT": False},
        **stack,
    )
    for spread in (True, False):
        add(
            f"decode stack, rope in the attention phase (qkv_rope off), spread={spread}",
            kernel,
            {**(STACK if spread else serial), "QKV_ROPE": False},
            **stack,
        )
    kernel = triton_attention._paged_attention_kernel
    for fp8, prefetch in ((False, 0), (False, 1), (False, 2), (True, 1)):
        add(
            f"paged attention, fp8={fp8}, prefetch={prefetch}",
            kernel,
            {**ATTENTION, "FP8": fp8, "PREFETCH": prefetch},
            fp8,
            num_warps=4,
            num_stages=2,
        )
    kernel = triton_attention._paged_attention_spread_kernel
    for fp8, prefetch, d in ((False, 2, 64), (False, 2, 128), (True, 1, 128)):
        add(
            f"paged attention, spread, fp8={fp8}, prefetch={prefetch}, D={d}",
            kernel,
            {**ATTENTION, "FP8": fp8, "PREFETCH": prefetch, "D": d, "G": 4 if d == 128 else 3},
            fp8,
            num_warps=4,
            num_stages=2,
        )
    for late in (False, True):  # the PDL trigger at the start or after the K loop
        add(
            f"GEMM, late={late}",
            triton_matmul._gemm_kernel,
            {**GEMM, "UPCAST": False, "LATE": late},
            num_warps=2,
            num_stages=4,
        )
        for epilogue in ("RESIDUAL", "GATED", "NORM"):
            add(
                f"fused GEMM, {epilogue.lower()}, late={late}",
                triton_fused._fused_gemm_kernel,
                {**FUSED, epilogue: True, "LATE": late},
                num_warps=2,
                num_stages=4,
            )
    # the residual GEMMs' deeper pipelines (triton_fused.RESIDUAL_STAGES): two programs an SM
    for stages in (6, 7):
        add(
            f"fused GEMM, residual, {stages} stages",
            triton_fused._fused_gemm_kernel,
            {**FUSED, "RESIDUAL": True},
            num_warps=2,
            num_stages=stages,
        )
    # the normed prefill tiles (fused_config: 64 and 128 rows)
    for bm, bn, bk, warps, gated in (
        (64, 64, 64, 4, False),
        (128, 64, 64, 8, False),
        (64, 32, 32, 4, True),
    ):
        add(
            f"fused GEMM, norm, {bm}x{bn}x{bk}, {warps} warps, gated={gated}",
            triton_fused._fused_gemm_kernel,
            {**FUSED, "NORM": True, "GATED": gated, "BM": bm, "BN": bn, "BK": bk, "UNROLL": 1},
            num_warps=warps,
            num_stages=3,
        )
    # the thin tile of a wide model's gate_up (triton_matmul.MLP_MAX_WIDTH)
    add(
        "GEMM, 16x64x256, 4 warps, 3 stages",
        triton_matmul._gemm_kernel,
        {**GEMM, "UPCAST": False, "BN": 64},
        num_warps=4,
        num_stages=3,
    )
    # the QKV product with rope and the cache write in its epilogue: the 8B thin tile (no
    # norm) and SmolLM2-135M's (the norm prologue)
    for hq, hkv, d, norm in ((32, 8, 128, False), (9, 3, 64, True)):
        add(
            f"QKV + rope, HQ={hq} HKV={hkv} D={d} norm={norm}",
            triton_fused._qkv_rope_kernel,
            {
                "HQ": hq,
                "HKV": hkv,
                "D": d,
                "NORM": norm,
                "HAS_BIAS": False,
                "ROUND": 1,
                "BM": 16,
                "BN": 16,
                "BK": 256,
                "GROUP_M": 8,
                "CH": 64,
                "UNROLL": 8,
                "PDL": True,
            },
            num_warps=2,
            num_stages=4,
        )
    # the LM head from Q8_0 blocks at its tiles (triton_matmul.q8_tile's two)
    for cfg in (triton_matmul.Q8_TILE_FEW, triton_matmul.Q8_TILE_MANY):
        add(
            f"Q8_0 GEMM, {cfg.bm}x{cfg.bn}x{cfg.bk}, {cfg.warps} warps, {cfg.stages} stages",
            triton_matmul._gemm_q8_kernel,
            {
                "BM": cfg.bm,
                "BN": cfg.bn,
                "QB": cfg.bk,
                "GROUP_M": 8,
                "UPCAST": True,
                "PDL": True,
                "LATE": False,
                "FMA": True,
            },
            num_warps=cfg.warps,
            num_stages=cfg.stages,
        )
    # rope + cache write + attention in one launch (the stack's attention phase), both shapes
    for hq, hkv, d in ((9, 3, 64), (32, 8, 128)):
        add(
            f"rope + attention, HQ={hq} HKV={hkv} D={d}",
            triton_rope_attention._rope_attention_kernel,
            {
                "HQ": hq,
                "HKV": hkv,
                "D": d,
                "PAGE": 16,
                "BM": 16,
                "BN": 128 if d < 128 else 64,
                "SPLIT": 128 if d < 128 else 64,
                "TK": 16,
                "ROUND": 1,
                "PREFETCH": 2,
                "PDL": True,
            },
            num_warps=4,
            num_stages=2,
        )
    return out


def main() -> None:
    for label, fn, constexprs, fp8, options in forms():
        print(f"{label}:", report(fn, constexprs, fp8, **options))


if __name__ == "__main__":
    main()
