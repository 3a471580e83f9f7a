"""The one-launch decode stack against the layered path it replaces.

On CUDA the two must give the same bits (hidden state and the KV cache), at every grid
size and for every step shape the stack takes (decodes, verify blocks, several sequences,
the CUDA graphs' padded layout); under Triton's interpreter (one program, float32) they
must agree to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from triton_kit import DEVICE, INTERPRET, ON_CUDA, needs_triton

from mmserve.kernels import decode_stack
from mmserve.kernels.attention import AttentionMetadata, kv_layer
from mmserve.models.harness import SequenceRunner


def _layered(model, x, positions, meta, kv):
    for i, layer in enumerate(model.layers):
        x = layer(x, positions, model.rope, meta, kv_layer(kv, i))
    return x


def _launch(model, kv, x, positions, meta, programs, ids=None, scratch=None):
    from mmserve.kernels.triton_attention import paged_metadata
    from mmserve.kernels.triton_decode_stack import decode_stack as launch

    pm = paged_metadata(meta, 16)
    return launch(
        x if ids is None else model.embed_tokens.weight,
        decode_stack.stacked_weights(model.layers),
        kv,
        model.rope.cos,
        model.rope.sin,
        positions,
        pm.slot_mapping,
        pm.block_tables,
        pm.context_lens,
        pm.query_start,
        pm.query_lens,
        pm.max_query_len,
        heads=model.num_heads,
        kv_heads=model.num_kv_heads,
        eps=model.eps,
        scale=model.head_dim**-0.5,
        programs=programs,
        ids=ids,
        scratch=scratch,
    )


def _check(
    model, kv, x, positions, meta, programs, what: str = "", real=None, ids=None, scratch=None
) -> None:
    """One step: the one launch against the layered path (hidden state of the ``real``
    rows, default all, and cache bytes); the cache then holds the layered path's bytes.
    ``ids``: x's token ids, which the launch gathers from the embedding table itself;
    ``scratch``: the launch's (``decode_stack``'s)."""
    kv_want = kv.clone()
    want = _layered(model, x, positions, meta, kv_want)
    got = _launch(model, kv, x, positions, meta, programs, ids, scratch)
    if real is not None:
        got, want = got[real], want[real]
    if ON_CUDA:
        assert torch.equal(got, want), what
        assert torch.equal(kv, kv_want), f"{what}: cache bytes"
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(kv, kv_want, rtol=1e-5, atol=1e-5)
        kv.copy_(kv_want)


def _check_seqs(model, kv, seqs, programs, what: str = "", scratch=None) -> None:
    """A step of several sequences, each ``(block table, first position, tokens)``: the
    launch gathers the embedding rows from the ids (as the model's forward runs it), the
    layers take the rows."""
    meta = AttentionMetadata.build(
        [len(t) for _, _, t in seqs],
        [p + len(t) for _, p, t in seqs],
        [table for table, _, _ in seqs],
        16,
        DEVICE,
    )
    positions = torch.tensor([p + i for _, p, t in seqs for i in range(len(t))], device=DEVICE)
    ids = torch.tensor([tok for _, _, t in seqs for tok in t], device=DEVICE)
    _check(model, kv, model.embed(ids), positions, meta, programs, what, ids=ids, scratch=scratch)


def _check_step(model, runner, pos: int, token: int, programs, what: str = "") -> None:
    """One decode step of ``token`` at ``pos`` of the runner's sequence."""
    _check_seqs(model, runner.kv, [(runner.table, pos, [token])], programs, what)


def _tune(monkeypatch, tuning: dict | None) -> None:
    """The stack's launch settings (``StackTuning``; "spread": ``KernelConfig.spread``) for
    one test."""
    import dataclasses

    from mmserve.kernels import settings

    changes = dict(tuning or {})
    now = settings.current()
    spread = changes.pop("spread", now.spread)
    tuned = dataclasses.replace(now, spread=spread, stack=dataclasses.replace(now.stack, **changes))
    monkeypatch.setattr(settings, "_installed", [tuned])


def _model(tiny_llama):
    model = tiny_llama(str(DEVICE))
    return model if ON_CUDA else model.float()


# launch settings are speed only: the bits must not move with them
TUNINGS = [
    None,
    {"bk": 512, "bk_gated": 512, "num_stages": 3},
    {"bk": 64, "bk_gated": 64, "num_stages": 2, "unroll": 16},
    {"prefetch": False},
    {"att_prefetch": 2},
    {"unroll": 8},
    {"gated_one_dot": False},
    {"qkv_rope": False},
    {"qkv_rope": False, "spread": False},
    {"spread": False},
    {"early": False},
    {"bk_exact": False},
    {"bk_exact": False, "qkv_rope": False},
    {"defer": False},
    {"defer": False, "qkv_rope": False},
    {"defer": False, "unroll": 3},
    {"gemm_stages": None},
    {"gemm_stages": 6, "num_stages": 3},
    {"att_stages": None},
    {"att_stages": 2},
    {"v_l1": True},
    {"v_l1": True, "spread": False},
    {"k_t": True},
    {"k_t": True, "spread": False},
    {"k_t": False, "v_l1": False},
    {"k_t": False, "v_l1": False, "spread": False},
    {"k_t": True, "v_l1": True},
    {"qkv_hoist": True},
    {"k_t": True, "v_l1": True, "qkv_hoist": True, "spread": False},
    {"pdl": False},
    {"poll": None},
    {"poll": (4, 100, False), "spread": False},
    {"poll": (1, 0, True), "spread": False},
]
# ("defer" off: the normed phases norm from the rows, as the layered kernels do)
# where the queries and keys are rotated and the keys and values cached: in the QKV phase's
# epilogue (qkv_rope) or by the attention phase's programs
ROPE_MODES = [{"qkv_rope": True}, {"qkv_rope": False}]


@needs_triton
@torch.inference_mode()
@pytest.mark.parametrize(
    "programs,tuning",
    [(1, None), (3, None)] + [(None, t) for t in TUNINGS]
    if ON_CUDA
    else [
        (1, None),
        (1, {"spread": False}),
        (1, {"gated_one_dot": False}),
        (1, {"qkv_rope": False}),
        (1, {"early": False, "bk_exact": False}),
        (1, {"defer": False}),
        (1, {"k_t": True, "qkv_hoist": True, "v_l1": True}),
    ],
)
def test_decode_stack_equals_the_layers(tiny_llama, programs, tuning, monkeypatch):
    """Eight decode steps after a 37-token prompt, scattered cache blocks: each step's
    hidden state and cache bytes from the one launch equal the layered path's, whatever
    the grid and the launch settings."""
    _tune(monkeypatch, tuning)

    model = _model(tiny_llama)
    runner = SequenceRunner(model, max_len=256)
    rng = np.random.default_rng(3)
    runner.table = rng.permutation(len(runner.table)).tolist()
    prompt = rng.integers(0, 1000, 37).tolist()
    runner.step(prompt, 0)  # a prefill: the layered path
    for step in range(8):
        _check_step(
            model, runner, len(prompt) + step, int(rng.integers(0, 1000)), programs, f"step {step}"
        )


def _grouped_model(
    heads: int,
    kv_heads: int,
    head_dim: int,
    positions: int = 512,
    *,
    hidden: int = 64,
    inter: int = 96,
    layers: int = 1,
):
    """A random Llama whose kv heads each serve ``heads // kv_heads`` query heads (one
    layer of width 64 unless said)."""
    from mmserve.models.llama import hf_tensor_shapes
    from mmserve.models.registry import build_model

    h, vocab = hidden, 100
    cfg = dict(
        model_type="llama",
        hidden_size=h,
        num_hidden_layers=layers,
        head_dim=head_dim,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=True,
        max_position_embeddings=positions,
    )
    shapes = hf_tensor_shapes(cfg)
    gen = torch.Generator().manual_seed(1)
    sd = {
        k: torch.randn(v, generator=gen) * (1.0 if len(v) == 1 else v[-1] ** -0.5)
        for k, v in shapes.items()
    }
    return build_model(cfg, sd, torch.bfloat16 if ON_CUDA else torch.float32, DEVICE)


@needs_triton
@torch.inference_mode()
@pytest.mark.parametrize("prompt", [130, 254])
@pytest.mark.parametrize("rope", ROPE_MODES)
def test_decode_stack_equals_the_layers_at_smollm2_widths(prompt, rope, monkeypatch):
    """The default model's widths (hidden 576: a K loop of 256-wide steps ending in a
    partial one; 1,536 gate/up rows; 9 query heads on 3 kv heads of 64 dims), two layers
    of random weights: decode steps after ``prompt`` cached tokens (254: across the
    second split's end at 256) equal the layered path, hidden state and cache bytes (on
    CUDA bit for bit). The other tests' models are narrower than any real one."""
    _tune(monkeypatch, rope)
    model = _grouped_model(9, 3, 64, positions=1024, hidden=576, inter=1536, layers=2)
    runner = SequenceRunner(model, max_len=320)
    rng = np.random.default_rng(13)
    runner.table = rng.permutation(len(runner.table)).tolist()
    runner.step(rng.integers(0, 100, prompt).tolist(), 0)
    for step in range(4):
        _check_step(
            model,
            runner,
            prompt + step,
            int(rng.integers(0, 100)),
            None if ON_CUDA else 1,
            f"step {step}",
        )


@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA (bf16 bits; minutes under the interpreter)")
@pytest.mark.parametrize(
    "rope",
    [
        ROPE_MODES[0],
        ROPE_MODES[1],
        {**ROPE_MODES[0], "spread": False},
        {**ROPE_MODES[1], "spread": False},
    ],
)
def test_decode_stack_equals_the_layers_over_a_real_models_steps(rope, monkeypatch):
    """The whole SmolLM2-135M shape (30 layers, random weights), 128 teacher-forced decode
    steps after a 128-token prompt (contexts 129-256: two key splits, which the graphs run
    in one program each): every step's stack launch equals the layered one-row step, last
    hidden state and every layer's cache bytes (``benchmarks/stack_vs_layers.py``). A
    rounding difference in one phase shows here only now and then: rotated queries kept in
    registers (another QK summation order) moved one attention output element at 4 of these
    steps (one of ~900 layer steps), which the narrower tests above never hit."""
    import sys
    from pathlib import Path

    _tune(monkeypatch, rope)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import stack_vs_layers

    report = stack_vs_layers.check(
        "smollm2-135m", None, 128, 1, 0, "cuda", log=lambda *a, **k: None
    )
    sys.modules.pop("stack_vs_layers", None)
    assert report["differing_steps"] == []


@needs_triton
@torch.inference_mode()
def test_decode_stack_more_query_heads_than_one_attention_tile():
    """34 query heads on 2 kv heads: 17 rows a kv head, two 16-row attention tiles."""
    model = _grouped_model(34, 2, 16)
    runner = SequenceRunner(model, max_len=64)
    runner.step(list(range(1, 20)), 0)
    _check_step(model, runner, 19, 42, None if ON_CUDA else 1)


@needs_triton
@torch.inference_mode()
@pytest.mark.parametrize("prompt", [41, 250])
@pytest.mark.parametrize("rope", ROPE_MODES)
def test_decode_stack_verify_blocks(tiny_llama, prompt, rope, monkeypatch):
    """Verify-shaped steps of one sequence: 2, 5, 9 and 16 tokens (the last one two 16-row
    attention tiles of a kv head, causal inside the block), each equal to the layers; after
    250 cached tokens the blocks cross a split boundary (256) and their tiles' splits run
    in programs of their own on CUDA. ``rope``: where the queries are rotated."""
    _tune(monkeypatch, rope)
    model = _model(tiny_llama)
    runner = SequenceRunner(model, max_len=320)
    rng = np.random.default_rng(5)
    runner.table = rng.permutation(len(runner.table)).tolist()
    pos = prompt
    runner.step(rng.integers(0, 1000, pos).tolist(), 0)
    for n in (2, 5, 9, 16):
        toks = rng.integers(0, 1000, n).tolist()
        _check_seqs(
            model, runner.kv, [(runner.table, pos, toks)], None if ON_CUDA else 1, f"{n} tokens"
        )
        pos += n


@needs_triton
@torch.inference_mode()
@pytest.mark.parametrize("rope", ROPE_MODES)
def test_decode_stack_long_context(rope, monkeypatch):
    """Decode steps at 700-703 cached tokens: six 128-key splits (on CUDA each in a
    program of its own, merged by the last to finish, more splits than one round of the
    merge's loads), equal to the layers."""
    _tune(monkeypatch, rope)
    model = _grouped_model(6, 2, 64, positions=1024)
    runner = SequenceRunner(model, max_len=768)
    rng = np.random.default_rng(11)
    runner.table = rng.permutation(len(runner.table)).tolist()
    runner.step(rng.integers(0, 100, 700).tolist(), 0)
    for step in range(4):
        _check_step(
            model,
            runner,
            700 + step,
            int(rng.integers(0, 100)),
            None if ON_CUDA else 1,
            f"step {step}",
        )


@needs_triton
@torch.inference_mode()
@pytest.mark.parametrize("rope", ROPE_MODES)
def test_decode_stack_several_sequences(tiny_llama, rope, monkeypatch):
    """Three sequences with their own scattered blocks and lengths: a decode step of
    each, then a mixed step (1, 4 and 2 tokens), equal to the layers."""
    _tune(monkeypatch, rope)
    model = _model(tiny_llama)
    runner = SequenceRunner(model, max_len=3 * 128)
    rng = np.random.default_rng(7)
    blocks = rng.permutation(len(runner.table)).tolist()
    tables = [blocks[i * 8 : (i + 1) * 8] for i in range(3)]
    lens = [19, 70, 33]
    for table, n in zip(tables, lens, strict=True):
        runner.table = table
        runner.step(rng.integers(0, 1000, n).tolist(), 0)
    programs = None if ON_CUDA else 1
    step = [(t, n, [int(rng.integers(0, 1000))]) for t, n in zip(tables, lens, strict=True)]
    _check_seqs(model, runner.kv, step, programs, "decode of three")
    lens = [n + 1 for n in lens]
    mixed = [
        (t, n, rng.integers(0, 1000, k).tolist())
        for t, n, k in zip(tables, lens, (1, 4, 2), strict=True)
    ]
    _check_seqs(model, runner.kv, mixed, programs, "mixed step")


@pytest.mark.skipif(not ON_CUDA or INTERPRET, reason="needs CUDA")
@torch.inference_mode()
@pytest.mark.parametrize("rope", ROPE_MODES)
def test_decode_stack_graph_padding_layout(tiny_llama, rope, monkeypatch):
    """The CUDA graphs' verify layout: sequence i owns rows i*q .., rows past its tokens
    and whole padding sequences write nothing (slot -1); the real rows and the cache equal
    the layers'."""
    _tune(monkeypatch, rope)
    from mmserve.kernels.triton_attention import PagedMetadata

    model = tiny_llama("cuda")
    runner = SequenceRunner(model, max_len=256)
    runner.step(list(range(5, 45)), 0)  # 40 cached tokens in blocks 0..2 of sequence 0
    q, counts = 5, (3, 5, 0)  # two sequences (3 and 5 tokens) and one of padding
    table = torch.tensor(
        [runner.table[:8], runner.table[8:16], runner.table[:8]], device=DEVICE, dtype=torch.int32
    )
    starts = (40, 0, 0)
    ids, pos, slots, real = [], [], [], []
    for i, (n, s) in enumerate(zip(counts, starts, strict=True)):
        for j in range(q):
            ok = j < n
            p = s + j if ok else 0
            ids.append(7 + i * q + j if ok else 0)
            pos.append(p)
            slots.append(int(table[i, p // 16]) * 16 + p % 16 if ok else -1)
            if ok:
                real.append(i * q + j)
    ctx = [s + n if n else 1 for n, s in zip(counts, starts, strict=True)]
    meta = PagedMetadata(
        torch.tensor(slots, device=DEVICE),
        table,
        torch.tensor(ctx, device=DEVICE),
        torch.arange(3, device=DEVICE) * q,
        torch.tensor([n or 1 for n in counts], device=DEVICE),
        q,
    )
    x = model.embed(torch.tensor(ids, device=DEVICE))
    _check(
        model,
        runner.kv,
        x,
        torch.tensor(pos, device=DEVICE),
        meta,
        None,
        "padded",
        real=torch.tensor(real, device=DEVICE),
    )


@pytest.mark.skipif(not ON_CUDA or INTERPRET, reason="needs CUDA")
def test_decode_stack_applies_up_to_sixteen_rows(tiny_llama):
    from mmserve.kernels.triton_decode_stack import MAX_ROWS

    model = tiny_llama("cuda")
    kv = SequenceRunner(model, max_len=32).kv
    h = model.embed_tokens.weight.shape[1]
    assert MAX_ROWS == 16
    for n, want in ((1, True), (16, True), (17, False)):
        x = torch.zeros(n, h, dtype=torch.bfloat16, device="cuda")
        assert decode_stack.applies(x, kv, model.layers) is want, n


def test_stacked_weights_are_the_layers_own(tiny_llama):
    """Stacking rebinds every layer's parameter as a view of the stack: no second copy,
    and the model computes what it did before."""
    model = tiny_llama("cpu").float()
    runner = SequenceRunner(model, max_len=64)
    before = runner.step([5, 6, 7], 0)
    weights = decode_stack.stacked_weights(model.layers)
    for i, layer in enumerate(model.layers):
        assert layer.attn.qkv_weight.data_ptr() == weights["qkv"][i].data_ptr()
        assert layer.mlp.down_weight.data_ptr() == weights["down"][i].data_ptr()
        assert layer.post_attn_norm.data_ptr() == weights["post_norm"][i].data_ptr()
    assert decode_stack.stacked_weights(model.layers) is weights
    runner.kv.zero_()
    assert torch.equal(runner.step([5, 6, 7], 0), before)


def test_decode_stack_never_runs_on_cpu(tiny_llama):
    from mmserve.kernels import settings

    assert settings.current().decode_stack
    model = tiny_llama("cpu").float()
    x = torch.zeros(1, 256)
    decode_stack.stacked_weights(model.layers)
    assert not decode_stack.applies(x, SequenceRunner(model, max_len=32).kv, model.layers)


@pytest.mark.skipif(not ON_CUDA or INTERPRET, reason="needs CUDA")
@torch.inference_mode()
def test_greedy_tokens_same_with_and_without_the_stack(tiny_llama):
    """Through the model's forward (the stack runs every one-token step): the same tokens
    and logits as the layered path."""
    model = tiny_llama("cuda")
    prompt = list(range(3, 40))
    runs = []
    from mmserve.kernels import settings

    for on in (False, True):
        with settings.override(decode_stack=on):
            runner = SequenceRunner(model, max_len=256)
            logits = [runner.step(prompt, 0)[-1]]
            ids = [int(logits[0].argmax())]
            for _ in range(16):
                logits.append(runner.step(ids[-1:], len(prompt) + len(ids) - 1)[-1])
                ids.append(int(logits[-1].argmax()))
            runs.append((ids, torch.stack(logits)))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])
