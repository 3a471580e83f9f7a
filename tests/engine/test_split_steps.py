"""Mixed steps replayed from graphs against the same steps run eagerly (CUDA only).

A step that decodes some requests while others' prompt chunks run (a request arriving
while others decode; an image caption job's every admission) replays the decode graph
for its decodes and a prefill graph for each chunk, one that starts from input
embeddings for a chunk with an image; with async scheduling a request arriving while
steps run ahead is admitted into the step launched ahead, its chunk replayed beside the
decodes. The kernels are batch-invariant, so every request's tokens must be the eager
engine's exactly, with requests arriving at different steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmserve import SamplingParams
from mmserve.bench.engine_run import make_kv
from mmserve.config import EngineConfig
from mmserve.engine.cuda_graphs import DecodeGraphs
from mmserve.engine.factory import create_engine
from mmserve.kernels.triton_attention import PagedMetadata

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
PAGE = 16
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "Water boils at",
    "Dear Sir or Madam,",
    "Q: What is 7 times 8?\nA:",
    "My favourite colour is",
    "import numpy as np\n",
]


@torch.inference_mode()
def test_prefill_graphs_from_embeddings_equal_the_eager_forward(tiny_llama):
    """Chunks whose embeddings carry spliced-in rows (an image's), replayed from the
    embeddings graphs: the eager forward's last-row logits and KV bytes exactly."""
    model = tiny_llama()
    blocks = 64
    graph_kv, eager_kv = (
        make_kv(model, blocks, torch.bfloat16),
        make_kv(model, blocks, torch.bfloat16),
    )
    graphs = DecodeGraphs(
        model, graph_kv, blocks, (1,), (16, 64, 256), last_row_only=True, embeds_input=True
    )
    graphs.capture()
    rng = np.random.default_rng(1)
    table = rng.permutation(np.arange(1, blocks))[:30]
    prompt = rng.integers(0, 1000, 400).tolist()
    gen = torch.Generator(device="cuda").manual_seed(0)
    start = 0
    for n in (7, 16, 50, 200, 64):
        ids = prompt[start : start + n]
        x = model.embed(torch.tensor(ids, device="cuda"))
        x[n // 3 : n // 2] = torch.randn(
            n // 2 - n // 3, x.shape[1], generator=gen, device="cuda"
        ).to(x.dtype)
        got, top, _ = graphs.run_verify(
            [ids], [start], table[None].astype(np.int64), PAGE, embeds=x
        )
        assert torch.equal(top, got.argmax(-1))
        pos = np.arange(start, start + n)
        meta = PagedMetadata(
            torch.as_tensor(table[pos // PAGE] * PAGE + pos % PAGE, device="cuda"),
            torch.as_tensor(table[None], device="cuda"),
            torch.tensor([start + n], device="cuda"),
            torch.tensor([0], device="cuda"),
            torch.tensor([n], device="cuda"),
            n,
        )
        hidden = model(None, torch.as_tensor(pos, device="cuda"), meta, eager_kv, inputs_embeds=x)
        assert torch.equal(got, model.compute_logits(hidden[-1:])), (start, n)
        start += n
    assert torch.equal(graph_kv, eager_kv)


@torch.inference_mode()
def test_several_chunks_from_embeddings_in_one_replay_equal_the_eager_forward(tiny_llama):
    """Three chunks of three sequences (different lengths and starts, one with spliced
    rows) in one replay of a batch-4 graph: each one's last-row logits and the KV bytes
    equal the eager forward of all three in one batch."""
    model = tiny_llama()
    blocks = 96
    graph_kv, eager_kv = (
        make_kv(model, blocks, torch.bfloat16),
        make_kv(model, blocks, torch.bfloat16),
    )
    graphs = DecodeGraphs(
        model, graph_kv, blocks, (2, 4), (16, 64), last_row_only=True, embeds_input=True
    )
    graphs.capture()
    rng = np.random.default_rng(2)
    tables = rng.permutation(np.arange(1, blocks))[:60].reshape(3, 20).astype(np.int64)
    lens, starts = [40, 9, 64], [0, 16, 5]
    tokens = [rng.integers(0, 1000, n).tolist() for n in lens]
    flat = torch.tensor([t for ids in tokens for t in ids], device="cuda")
    x = model.embed(flat)
    x[45:49] = torch.randn(4, x.shape[1], device="cuda").to(x.dtype)  # in the second
    got, top, q = graphs.run_verify(tokens, starts, tables, PAGE, embeds=x)
    assert q == 64 and got.shape[0] == 3 and torch.equal(top, got.argmax(-1))
    pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    seq = np.repeat(np.arange(3), lens)
    meta = PagedMetadata(
        torch.as_tensor(tables[seq, pos // PAGE] * PAGE + pos % PAGE, device="cuda"),
        torch.as_tensor(tables, device="cuda"),
        torch.tensor([s + n for s, n in zip(starts, lens, strict=True)], device="cuda"),
        torch.tensor(np.cumsum([0, *lens[:-1]]), device="cuda"),
        torch.tensor(lens, device="cuda"),
        max(lens),
    )
    hidden = model(None, torch.as_tensor(pos, device="cuda"), meta, eager_kv, inputs_embeds=x)
    last = torch.tensor(np.cumsum(lens) - 1, device="cuda")
    assert torch.equal(got, model.compute_logits(hidden[last]))
    assert torch.equal(graph_kv, eager_kv)  # padding rows and sequences wrote nothing


def _engine(eager: bool, connector: str = "none"):
    return create_engine(
        EngineConfig(
            device="cuda",
            max_num_seqs=16,
            max_model_len=512,
            kv_cache_memory_mb=256,
            enforce_eager=eager,
            warmup=False,
            preload_grammar=False,
            connector=connector,
        )
    )


# (enforce_eager, async_scheduling): the eager engine (its steps launched ahead run their
# chunks eagerly too), graphs with the synchronous loop (arrivals in split steps), graphs
# with steps launched ahead (arrivals admitted into them)
RUNS = ((True, True), (False, False), (False, True))


def _staggered(engine, requests) -> tuple[dict[str, list[int]], int, int]:
    """Add ``requests`` ((prompt ids, spans) pairs) two at a time, two steps apart, and
    step to the end -> each request's tokens, the runner's split steps, and the requests
    admitted into steps launched ahead."""
    params = [
        SamplingParams(temperature=0, max_tokens=(9, 17, 24, 5)[i % 4])
        for i in range(len(requests))
    ]
    tokens: dict[str, list[int]] = {}
    pending = list(enumerate(requests))
    step = 0
    while pending or engine.has_unfinished():
        if step % 2 == 0:
            for i, (ids, spans) in pending[:2]:
                engine.add_request(ids, params[i], f"r{i}", spans)
            pending = pending[2:]
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        step += 1
    return tokens, engine.runner.split_steps, engine.launch.ahead_admissions


def _check(outputs: list[tuple[dict[str, list[int]], int, int]]) -> None:
    (eager, eager_splits, _), (sync, sync_splits, _), (ahead, _, admitted) = outputs
    assert eager_splits == 0 and sync_splits > 0 and admitted > 0
    assert sync == eager and ahead == eager


def test_text_arrivals_during_decodes_equal_the_eager_engine():
    outputs = []
    for eager, overlap in RUNS:
        engine = _engine(eager)
        engine.async_scheduling = overlap
        tok = engine.tokenizer
        reqs = [
            (tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])), None)
            for p in PROMPTS
        ]
        outputs.append(_staggered(engine, reqs))
        del engine
        torch.cuda.empty_cache()
    _check(outputs)


def test_image_prompts_arriving_during_decodes_equal_the_eager_engine():
    from connectors import synthetic
    from connectors.prompt import ImageChatPrompt

    outputs = []
    for eager, overlap in RUNS:
        engine = _engine(eager, connector="auto")
        engine.async_scheduling = overlap
        assert engine.connector is not None, "the default connector is served"
        assert (engine.runner.span_prefill_graphs is None) == eager
        turn = ImageChatPrompt(engine.tokenizer, engine.connector.processor, "Describe the image.")
        reqs = []
        for i in range(8):
            prompt = turn([synthetic.sample("test", 500 + i)[0]])
            reqs.append((prompt.ids, prompt.spans))
        outputs.append(_staggered(engine, reqs))
        del engine
        torch.cuda.empty_cache()
    _check(outputs)
