"""bench throughput: config handling and the report on CPU; on CUDA, the graph-replayed decode
gives the same logits bits as the eager step and as the single-sequence harness."""

from __future__ import annotations

import argparse

import pytest
import torch

from mmserve.bench.report import table
from mmserve.bench.throughput import ThroughputConfig

ON_CUDA = torch.cuda.is_available()


def test_config_from_namespace_and_validation():
    ns = argparse.Namespace(models=["smollm2-135m"], batch_sizes=[1, 8], prompt_len=None,
                            unrelated=3)
    cfg = ThroughputConfig.from_args(ns)
    assert cfg.models == ("smollm2-135m",) and cfg.batch_sizes == (1, 8)
    assert cfg.prompt_len == ThroughputConfig.prompt_len
    with pytest.raises(ValueError, match="unknown model shape"):
        ThroughputConfig(models=("gpt-5",))
    with pytest.raises(ValueError, match="variant"):
        ThroughputConfig(variants=("invariant+fast",))


def test_table_lists_every_variant_and_the_roofline():
    dec = {"1": {"tok_s": 200.0}, "32": {"tok_s": 5000.0}}
    result = {
        "machine": {"gpu": "NVIDIA H200"}, "weights": "random (bf16)",
        "bandwidth": {"gb_s": [4200.0, 4250.0]},
        "models": {"llama3-8b": {
            "weight_bytes": 16.06e9, "roofline_tok_s": 265.0,
            "engine": {"invariant": {"decode": dec, "prefill": {
                "ttft_ms": 90.0, "prefill_tok_s": 22755.0}}},
            "hf": {"eager": {"1": {"tok_s": 14.0}}, "prefill": {"ttft_ms": 300.0,
                                                                "prefill_tok_s": 6800.0}}}}}
    text = table(result)
    assert "invariant" in text and "hf_eager" in text and "75.5" in text
    assert "roofline b1 265 tok/s" in text


def _tiny_model():
    from mmserve.models.registry import build_model

    cfg = dict(model_type="llama", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=512, vocab_size=1000, head_dim=64,
               tie_word_embeddings=False, max_position_embeddings=512)
    torch.manual_seed(0)
    names = {"model.embed_tokens.weight": (1000, 256), "lm_head.weight": (1000, 256),
             "model.norm.weight": (256,)}
    for i in range(2):
        p = f"model.layers.{i}"
        names |= {f"{p}.self_attn.q_proj.weight": (256, 256), f"{p}.self_attn.k_proj.weight":
                  (128, 256), f"{p}.self_attn.v_proj.weight": (128, 256),
                  f"{p}.self_attn.o_proj.weight": (256, 256), f"{p}.mlp.gate_proj.weight":
                  (512, 256), f"{p}.mlp.up_proj.weight": (512, 256),
                  f"{p}.mlp.down_proj.weight": (256, 512), f"{p}.input_layernorm.weight": (256,),
                  f"{p}.post_attention_layernorm.weight": (256,)}
    sd = {k: torch.randn(s) * (1.0 if len(s) == 1 else s[-1] ** -0.5) for k, s in names.items()}
    model = build_model(cfg, sd, torch.bfloat16, "cuda")
    return model


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_graph_decode_rows_equal_eager_and_single_sequence_harness():
    from mmserve.bench.engine_run import BLOCK_SIZE, PagedDecoder
    from mmserve.models.harness import SequenceRunner

    model = _tiny_model()
    prompts = [torch.randint(0, 1000, (n,)).tolist() for n in (7, 30, 19)]
    dec = PagedDecoder(model, 4, 96)
    dec.capture((1, 2, 4))
    first = dec.prefill(prompts)
    ids, pos = first, [len(p) for p in prompts]
    refs = [SequenceRunner(model, 96) for _ in prompts]
    ref_first = [int(r.step(p, 0)[-1].argmax()) for r, p in zip(refs, prompts, strict=True)]
    assert first == ref_first
    for _ in range(6):
        graph = dec.graphs.run(ids, pos, dec.tables[:3], BLOCK_SIZE).clone()
        for i, r in enumerate(refs):
            assert torch.equal(graph[i], r.step([ids[i]], pos[i])[0]), i
        ids, pos = graph.argmax(-1).tolist(), [p + 1 for p in pos]
    # the eager path (a batch too big for any graph would take it) rewrites the same KV
    eager = dec.graphs.run_eager(ids, pos, dec.tables[:3], BLOCK_SIZE)
    graph = dec.graphs.run(ids, pos, dec.tables[:3], BLOCK_SIZE)
    assert torch.equal(eager, graph)
