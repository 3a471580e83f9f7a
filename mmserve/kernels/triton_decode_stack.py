"""A Llama decoder stack for one decode token in one persistent Triton launch.

At batch 1 a small model's step is a chain of short kernels, each bound by its own
critical path (bench/NOTES.md, session 5: SmolLM2-135M ~30 us a layer over six launches,
1,089 tok/s). Here a fixed grid of at most one program per SM runs every layer; the six
launches of a layer become five phases separated by grid barriers
(:mod:`mmserve.kernels.triton_grid`, ~1.1 us each on the H200):

A. RMSNorm + QKV product (``fused_tile``, tiles over the QKV columns);
B. per kv head: rope of its query heads and its key, the key and value written to the
   paged cache, then attention over the cache (``attention_rows``) — one program owns a
   kv head, so the write and the read need only a barrier of its own threads;
C. o product + residual; D. RMSNorm + gate/up product + silu * up; E. down product +
   residual (``fused_tile``).

Bits. Every phase calls the device functions of the layered kernels
(:mod:`mmserve.kernels.triton_fused`, :mod:`mmserve.kernels.triton_attention`) with the
same arithmetic, so the stack's output equals the six-launch layer's bit for bit (tests
on the GPU); the tile shape differs, which the GEMM's invariance covers. So greedy
outputs do not depend on which path ran a step.

Every intermediate has its own buffer per layer (written once per launch), and values
another program wrote are read through L2 (``.cg``), never a stale L1 line.

Prefetch. The weights (~7 MB a layer at SmolLM2-135M) and the cache stream from HBM, so
each phase's first loads waited on HBM latency. While phase B runs on the kv heads'
programs, the others ask L2 for the next layer's weights, norm weights and cached keys
and values (``prefetch.global.L2``: no register waits for it). On the H200 a batch-1
replay went 852 -> 812 us (bench/NOTES.md, session 9); issued by every program at a
layer's start instead, the asking cost the QKV phase ~0.7 us and the gain was 851 -> 838.
A hint moves no bits.
"""

from __future__ import annotations

import torch

from mmserve.kernels.triton_fused import NORM_CHUNK, _round_mode, norm_unroll

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BN = 16  # output columns per GEMM tile (weight streaming at M=1: many thin tiles)
# Speed only (the bits do not depend on them; the attention phase needs 4 warps to keep
# the layered kernel's row-sum order): norm chunks loaded per round, pipeline stages,
# the K step of the plain and the gated products.
# "prefetch": the next layer into L2 during phase B; "att_prefetch": attention_rows'
# PREFETCH mode, 1 (block ids a step ahead): keys and values a step ahead too (mode 2,
# the layered kernel's) made the H200 replay 825 us against 813 (session 9).
TUNING = {"unroll": norm_unroll(16), "num_stages": 4, "bk": 256, "bk_gated": 256,
          "prefetch": True, "att_prefetch": 1}
KV_ROWS = 16  # cache positions a program asks L2 for per round (the next layer's keys/values)


if triton is not None:
    from mmserve.kernels.triton_attention import BLOCK_M, BLOCK_N, attention_rows
    from mmserve.kernels.triton_fused import _rotate_heads, fused_tile, rope_row
    from mmserve.kernels.triton_grid import grid_sync, prefetch_l2, prefetch_share

    @triton.jit
    def _prefetch_layer(lw, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, n1_ptr, n2_ptr, worker,
                        workers, H: tl.constexpr, Q: tl.constexpr, QKV: tl.constexpr,
                        INTER: tl.constexpr, LINE: tl.constexpr, LQKV: tl.constexpr,
                        LO: tl.constexpr, LGU: tl.constexpr, LD: tl.constexpr,
                        LN: tl.constexpr):
        """Layer ``lw``'s weights into L2, ``worker``'s share of their lines."""
        prefetch_share(n1_ptr + lw * H, H, worker, workers, LINE, LN)
        prefetch_share(n2_ptr + lw * H, H, worker, workers, LINE, LN)
        prefetch_share(wqkv_ptr + lw * QKV * H, QKV * H, worker, workers, LINE, LQKV)
        prefetch_share(wo_ptr + lw * H * Q, H * Q, worker, workers, LINE, LO)
        prefetch_share(wgu_ptr + lw * 2 * INTER * H, 2 * INTER * H, worker, workers, LINE,
                       LGU)
        prefetch_share(wd_ptr + lw * H * INTER, H * INTER, worker, workers, LINE, LD)

    @triton.jit
    def _prefetch_kv(kc, vc, tables_ptr, ctx_ptr, worker, workers, stride_kb, stride_ks,
                     ROW: tl.constexpr, PAGE: tl.constexpr, LINE: tl.constexpr,
                     ROWS: tl.constexpr, LINES: tl.constexpr):
        """A layer's cached keys and values of the sequence (every kv head: ``ROW``
        elements a position) into L2; ``worker`` takes every ``workers``-th run of
        ``ROWS`` positions."""
        n_ctx = tl.load(ctx_ptr)
        c = tl.minimum(tl.arange(0, LINES) * LINE, ROW - 1)
        for base in range(worker * ROWS, n_ctx, workers * ROWS):
            j = tl.minimum(base + tl.arange(0, ROWS), n_ctx - 1)
            blk = tl.load(tables_ptr + j // PAGE).to(tl.int64)
            off = (blk * stride_kb + (j % PAGE) * stride_ks)[:, None] + c[None, :]
            prefetch_l2(kc + off)
            prefetch_l2(vc + off)

    @triton.jit
    def _rope_write_head(qkv, qrot, kc, vc, cos_ptr, sin_ptr, pos_ptr, slot_ptr, h,
                         HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                         G: tl.constexpr, BLOCK_G: tl.constexpr, ROUND: tl.constexpr):
        """Kv head ``h`` of the token: rotate its G query heads into ``qrot`` and its key
        into the cache slot, copy its value there (``_rope_write_kv_kernel``'s math)."""
        HALF: tl.constexpr = D // 2
        c1, s1, c2, s2 = rope_row(cos_ptr, sin_ptr, pos_ptr, HALF, ROUND)
        _rotate_heads(qkv + h * G * D, qrot + h * G * D, G, c1, s1, c2, s2, HALF, BLOCK_G,
                      ROUND, ".cg")
        slot = tl.load(slot_ptr).to(tl.int64)
        if slot >= 0:
            row = slot * HKV * D + h * D
            _rotate_heads(qkv + HQ * D + h * D, kc + row, 1, c1, s1, c2, s2, HALF, 1, ROUND,
                          ".cg")
            d = tl.arange(0, D)
            tl.store(vc + row + d, tl.load(qkv + (HQ + HKV) * D + h * D + d,
                                           cache_modifier=".cg"))

    @triton.jit
    def _stamp(timing_ptr, idx, pid, TIMING: tl.constexpr):
        """Program 0 records its SM clock (cycles) at slot ``idx`` (phase timing)."""
        if TIMING:
            if pid == 0:
                t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [pid],
                                              dtype=tl.int64, is_pure=False, pack=1)
                tl.store(timing_ptr + idx, t)

    @triton.jit
    def _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING: tl.constexpr):
        """End phase number ``phase`` (0, 1, ...): the grid barrier after it, program 0's
        clock stamped before (its work done) and after (every program arrived) -> the
        next phase's number."""
        _stamp(timing_ptr, 2 * phase, pid, TIMING)
        grid_sync(counter_ptr, phase + 1, P)
        _stamp(timing_ptr, 2 * phase + 3, pid, TIMING)
        return phase + 1

    @triton.jit
    def _decode_stack_kernel(
        xs_ptr, mids_ptr, qkv_ptr, qrot_ptr, attn_ptr, act_ptr,
        wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, n1_ptr, n2_ptr,
        kv_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, tables_ptr, ctx_ptr, qstart_ptr,
        qlen_ptr, counter_ptr, timing_ptr, L, eps, scale_log2,
        stride_kvl, stride_kv2, stride_kb, stride_ks, stride_kh, stride_bt,
        H: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
        INTER: tl.constexpr, PAGE: tl.constexpr, P: tl.constexpr, BN: tl.constexpr,
        BK: tl.constexpr, BKG: tl.constexpr, CH: tl.constexpr, UNROLL: tl.constexpr,
        ROUND: tl.constexpr, BLOCK_G: tl.constexpr, ATT_BM: tl.constexpr,
        ATT_BN: tl.constexpr, TIMING: tl.constexpr, PREFETCH: tl.constexpr,
        LINE: tl.constexpr, LQKV: tl.constexpr, LO: tl.constexpr, LGU: tl.constexpr,
        LD: tl.constexpr, LN: tl.constexpr, KV_ROWS: tl.constexpr, KV_LINES: tl.constexpr,
        ATT_PREFETCH: tl.constexpr,
    ):
        pid = tl.program_id(0)
        _stamp(timing_ptr, 1, pid, TIMING)
        G: tl.constexpr = HQ // HKV
        Q: tl.constexpr = HQ * D
        QKV: tl.constexpr = (HQ + 2 * HKV) * D
        phase = 0
        # weights and cache stream from HBM: the programs without a kv head ask L2 for
        # the next layer's while the attention phase runs (issued at a layer's start by
        # every program instead, the asking cost the QKV phase 0.7 us)
        PREFETCH_ON: tl.constexpr = PREFETCH and P > HKV
        if PREFETCH_ON:
            if pid >= HKV:
                _prefetch_layer(tl.cast(0, tl.int64), wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr,
                                n1_ptr, n2_ptr, pid - HKV, P - HKV, H, Q, QKV, INTER, LINE,
                                LQKV, LO, LGU, LD, LN)
        for layer in range(L):
            lw = tl.cast(layer, tl.int64)
            x_in = xs_ptr + lw * H
            mid = mids_ptr + lw * H
            qkv = qkv_ptr + lw * QKV
            qrot = qrot_ptr + lw * Q
            attn = attn_ptr + lw * Q
            act = act_ptr + lw * INTER
            # A: qkv = rms_norm(x) @ Wqkv.T
            for t in range(pid, (QKV + BN - 1) // BN, P):
                fused_tile(t, x_in, wqkv_ptr + lw * QKV * H, qkv, qkv, qkv, n1_ptr + lw * H,
                           1, QKV, H, QKV, H, H, QKV, QKV, eps, 0.0, True, False, False, False,
                           ROUND, 16, BN, BK, 8, CH, UNROLL, ".cg")
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING)
            # B: rope + cache write, then attention, one kv head per program
            kc = kv_ptr + lw * stride_kvl
            vc = kc + stride_kv2
            for h in range(pid, HKV, P):
                _rope_write_head(qkv, qrot, kc, vc, cos_ptr, sin_ptr, pos_ptr, slot_ptr, h,
                                 HQ, HKV, D, G, BLOCK_G, ROUND)
                tl.debug_barrier()  # the program's own writes, read back below
                for tile in tl.static_range((G + ATT_BM - 1) // ATT_BM):  # G query rows
                    attention_rows(0, tile, h, qrot, kc, vc, attn, tables_ptr, ctx_ptr,
                                   qstart_ptr, qlen_ptr, kc, vc, scale_log2, Q, D, Q, D,
                                   stride_kb, stride_ks, stride_kh, stride_bt, 0, 0, G, D,
                                   PAGE, 0, ATT_BM, ATT_BN, False, ATT_PREFETCH)
            if PREFETCH_ON:
                if pid >= HKV:
                    if layer + 1 < L:
                        _prefetch_layer(lw + 1, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, n1_ptr,
                                        n2_ptr, pid - HKV, P - HKV, H, Q, QKV, INTER, LINE,
                                        LQKV, LO, LGU, LD, LN)
                        _prefetch_kv(kc + stride_kvl, vc + stride_kvl, tables_ptr, ctx_ptr,
                                     pid - HKV, P - HKV, stride_kb, stride_ks, HKV * D, PAGE,
                                     LINE, KV_ROWS, KV_LINES)
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING)
            # C: mid = x + attn @ Wo.T
            for t in range(pid, (H + BN - 1) // BN, P):
                fused_tile(t, attn, wo_ptr + lw * H * Q, mid, mid, x_in, mid, 1, H, Q, H, Q, Q,
                           H, H, eps, 0.0, False, False, True, False, ROUND, 16, BN, BK, 8,
                           CH, UNROLL, ".cg")
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING)
            # D: act = silu(gate) * up of rms_norm(mid) @ Wgu.T
            for t in range(pid, (INTER + BN - 1) // BN, P):
                fused_tile(t, mid, wgu_ptr + lw * 2 * INTER * H, act, act, act,
                           n2_ptr + lw * H, 1, INTER, H, INTER, H, H, INTER, INTER, eps, 0.0,
                           True, False, False, True, ROUND, 16, BN, BKG, 8, CH, UNROLL, ".cg")
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING)
            # E: x_next = mid + act @ Wd.T
            for t in range(pid, (H + BN - 1) // BN, P):
                fused_tile(t, act, wd_ptr + lw * H * INTER, x_in + H, x_in, mid, x_in, 1, H,
                           INTER, H, INTER, INTER, H, H, eps, 0.0, False, False, True, False,
                           ROUND, 16, BN, BK, 8, CH, UNROLL, ".cg")
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING)


def widest_phase(hidden: int, qkv: int, inter: int, kv_heads: int) -> int:
    """The most tiles (or kv heads) any phase of a layer has."""
    return max(-(-qkv // BN), -(-hidden // BN), -(-inter // BN), kv_heads)


def stack_programs(hidden: int, qkv: int, inter: int, kv_heads: int, sms: int) -> int:
    """Grid size: enough programs for the widest phase, at most one per SM."""
    return max(1, min(sms, widest_phase(hidden, qkv, inter, kv_heads)))


def decode_stack(x: torch.Tensor, weights: dict[str, torch.Tensor], kv: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, query_start: torch.Tensor,
                 query_lens: torch.Tensor, *, heads: int, kv_heads: int, eps: float,
                 scale: float, programs: int | None = None,
                 timing: torch.Tensor | None = None) -> torch.Tensor:
    """Every layer for one token: x (1, H) -> the residual stream after the last layer.

    ``weights``: ``qkv`` (L, (Hq + 2 Hkv) D, H), ``o`` (L, H, Hq D), ``gate_up``
    (L, 2 I, H), ``down`` (L, H, I), ``input_norm``/``post_norm`` (L, H), contiguous.
    ``kv``: the whole cache (L, 2, blocks, block_size, Hkv, D), contiguous, x's dtype.
    The metadata are the paged-attention tensors of a one-sequence, one-token step.
    ``programs``: the grid (tests; default one per SM up to the widest phase).
    ``timing``: int64 (2 + 10 L,) for program 0's clock at the start, after each phase's
    work (even slots) and after each barrier (odd slots), in SM cycles (benchmarks).
    """
    n_layers, _, hidden = weights["qkv"].shape
    d = kv.shape[-1]
    inter = weights["down"].shape[-1]
    qkv_n = (heads + 2 * kv_heads) * d
    assert x.shape == (1, hidden) and kv.is_contiguous() and kv.dtype == x.dtype
    assert all(w.is_contiguous() for w in weights.values())
    dev, dt = x.device, x.dtype
    xs = torch.empty(n_layers + 1, hidden, dtype=dt, device=dev)
    xs[0].copy_(x[0])
    mids = torch.empty(n_layers, hidden, dtype=dt, device=dev)
    qkv = torch.empty(n_layers, qkv_n, dtype=dt, device=dev)
    qrot = torch.empty(n_layers, heads * d, dtype=dt, device=dev)
    attn = torch.empty(n_layers, heads * d, dtype=dt, device=dev)
    act = torch.empty(n_layers, inter, dtype=dt, device=dev)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    if programs is None:
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if x.is_cuda else 1
        programs = stack_programs(hidden, qkv_n, inter, kv_heads, sms)
    line = 128 // x.element_size()  # elements a 128-byte L2 line holds

    def lines(numel: int) -> int:  # a prefetching program's share of a matrix's lines
        workers = max(1, programs - kv_heads)
        return triton.next_power_of_2(triton.cdiv(triton.cdiv(numel, line), workers))

    _decode_stack_kernel[(programs,)](
        xs, mids, qkv, qrot, attn, act, weights["qkv"], weights["o"], weights["gate_up"],
        weights["down"], weights["input_norm"], weights["post_norm"], kv, cos, sin,
        positions, slot_mapping, block_tables, context_lens, query_start, query_lens, counter,
        timing if timing is not None else counter,
        n_layers, eps, scale * 1.4426950408889634,
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), kv.stride(4),
        block_tables.stride(0),
        H=hidden, HQ=heads, HKV=kv_heads, D=d, INTER=inter, PAGE=kv.shape[3], P=programs,
        BN=BN, BK=TUNING["bk"], BKG=TUNING["bk_gated"], CH=NORM_CHUNK, UNROLL=TUNING["unroll"],
        ROUND=_round_mode(dt), BLOCK_G=triton.next_power_of_2(heads // kv_heads),
        ATT_BM=BLOCK_M, ATT_BN=BLOCK_N, TIMING=timing is not None,
        PREFETCH=TUNING["prefetch"], LINE=line, LQKV=lines(qkv_n * hidden),
        LO=lines(hidden * heads * d), LGU=lines(2 * inter * hidden), LD=lines(hidden * inter),
        LN=lines(hidden),
        KV_ROWS=KV_ROWS, KV_LINES=triton.next_power_of_2(triton.cdiv(kv_heads * d, line)),
        ATT_PREFETCH=TUNING["att_prefetch"],
        num_warps=4, num_stages=TUNING["num_stages"])
    return xs[n_layers:]
