"""bench throughput: config handling, the variant loop (one KV cache alive at a time), the
row-0 comparison and the report on CPU; on CUDA, the graph-replayed decode gives the same
logits bits as the eager step and as the single-sequence harness, over a bf16 or fp8 cache."""

from __future__ import annotations

import argparse
import gc
import weakref

import pytest
import torch

from mmserve.bench import throughput
from mmserve.bench.engine_run import DecodeResult
from mmserve.bench.report import table
from mmserve.bench.throughput import ThroughputConfig, row0_comparison, token_agreement
from mmserve.kernels.fp8 import FP8_DTYPE

ON_CUDA = torch.cuda.is_available()


def test_config_from_namespace_and_validation():
    ns = argparse.Namespace(
        models=["smollm2-135m"], batch_sizes=[1, 8], prompt_len=None, unrelated=3
    )
    cfg = ThroughputConfig.from_args(ns)
    assert cfg.models == ("smollm2-135m",) and cfg.batch_sizes == (1, 8)
    assert cfg.prompt_len == ThroughputConfig.prompt_len
    with pytest.raises(ValueError, match="unknown model shape"):
        ThroughputConfig(models=("gpt-5",))
    with pytest.raises(ValueError, match="variant"):
        ThroughputConfig(variants=("invariant+fast",))
    with pytest.raises(ValueError, match="fp8kv"):  # the message lists what is allowed
        ThroughputConfig(variants=("fp8",))
    assert "fp8kv" in ThroughputConfig().variants
    assert ThroughputConfig.from_args({"variants": ["fp8kv"]}).variants == ("fp8kv",)
    with pytest.raises(ValueError, match="q8_head"):  # nothing to compare it with
        ThroughputConfig(variants=("invariant", "bf16head"))
    assert ThroughputConfig(variants=("bf16head",), q8_head=True).q8_head
    # the real default model (weights from its GGUF): no HF baseline for it
    real = ThroughputConfig(
        models=("smollm2-135m-instruct",), hf=False, variants=("invariant", "bf16head")
    )
    assert real.models == ("smollm2-135m-instruct",)
    with pytest.raises(ValueError, match="no-hf"):
        ThroughputConfig(models=("smollm2-135m-instruct",))


@pytest.mark.parametrize("tied", [True, False])
def test_q8_head_weights_round_the_lm_head_to_q8_0_in_both_models(tied):
    """The benchmark's --q8-head: the LM head's weight (a tied model's embedding) as exact
    Q8_0 values in the state dict, the same values in the HF model (its baselines)."""
    transformers = pytest.importorskip("transformers")
    from mmserve.bench.engine_run import q8_head_weights
    from mmserve.kernels.q8 import factor_q8

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=100,
        tie_word_embeddings=tied,
    )
    hf = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    before = hf.state_dict()
    key = "model.embed_tokens.weight" if tied else "lm_head.weight"
    other = "lm_head.weight" if tied else "model.embed_tokens.weight"
    untouched = {k: v.clone() for k, v in before.items() if k not in (key, other)}
    sd = q8_head_weights(hf)
    assert sd[key].dtype == torch.float32 and factor_q8(sd[key]) is not None
    assert torch.equal(hf.get_output_embeddings().weight, sd[key].bfloat16())
    assert all(torch.equal(sd[k], v) for k, v in untouched.items())
    if not tied:  # the embedding is another matrix: left as it was
        assert factor_q8(sd[other].float()) is None


def test_variants_grouped_by_kv_dtype_in_order():
    groups = throughput.kv_groups(("cublas", "fp8kv", "invariant", "unfused"))
    assert groups == [(None, ["cublas", "invariant", "unfused"]), (FP8_DTYPE, ["fp8kv"])]
    assert throughput.kv_groups(("fp8kv",)) == [(FP8_DTYPE, ["fp8kv"])]


class _FakeDecoder:
    """PagedDecoder's surface without a GPU: row 0 decodes ``base, base+1, ...``; an fp8 cache
    changes the tokens from step 3 on (as lossy KV may)."""

    live: weakref.WeakSet = weakref.WeakSet()

    def __init__(self, kv_dtype: torch.dtype | None) -> None:
        assert not _FakeDecoder.live, "a decoder (and its KV cache) is still alive"
        _FakeDecoder.live.add(self)
        self.kv_dtype = kv_dtype or torch.bfloat16
        self.kv_bytes = 2**30 if kv_dtype is None else 2**29

    def capture(self, sizes: tuple[int, ...]) -> dict:
        return {"batch_sizes": list(sizes)}

    def prefill(self, prompts: list[list[int]]) -> list[int]:
        return [0] * len(prompts)

    def decode(self, first, start_pos, steps, graphs, warmup=3, ahead=False) -> DecodeResult:
        row0 = [t if t < 3 or self.kv_dtype != FP8_DTYPE else -t for t in range(warmup + steps)]
        return DecodeResult(len(first), steps, 0.5, 1.0, 2.0, row0)

    def ttft(self, prompt_len: int, vocab: int) -> dict:
        return {"ttft_ms": 1.0, "prefill_tok_s": float(prompt_len)}


def test_engine_variants_free_each_cache_before_the_next(monkeypatch):
    cfg = ThroughputConfig(
        models=("smollm2-135m",),
        batch_sizes=(1, 2),
        decode_steps=7,
        variants=("fp8kv", "invariant", "cublas"),
        eager_steps=4,
    )
    made = []

    def make(kv_dtype):
        gc.collect()  # what free_device_memory does; the previous decoder must be gone
        made.append(kv_dtype)
        return _FakeDecoder(kv_dtype)

    engine = throughput.run_engine_variants(cfg, "tiny", make, vocab=100)
    assert made == [FP8_DTYPE, None]  # one fp8 decoder, one bf16 decoder shared by two
    assert list(engine) == ["fp8kv", "invariant", "cublas"]
    assert engine["fp8kv"]["kv_cache"] == {"dtype": "float8_e4m3fn", "gib": 0.5}
    assert engine["invariant"]["kv_cache"]["dtype"] == "bfloat16"
    assert engine["fp8kv"]["eager_b1"]["same_tokens_as_graphs"]
    cmp = row0_comparison(engine, "1")
    assert cmp["row0_tokens_equal_across_variants"] == {"invariant": True, "cublas": True}
    fp8 = cmp["row0_lossy_kv_agreement"]["fp8kv"]
    assert fp8 == {
        "reference": "invariant",
        "tokens": 10,
        "equal_fraction": 0.3,
        "first_mismatch": 3,
    }


def test_row0_comparison_never_asks_fp8_to_equal_bf16():
    def eng(row0):
        return {"decode": {"1": {"row0": row0}}}

    cmp = row0_comparison(
        {"cublas": eng([1, 2, 3]), "invariant": eng([1, 2, 4]), "fp8kv": eng([9, 2, 4])}, "1"
    )
    assert cmp["row0_tokens_equal_across_variants"] == {"cublas": False, "invariant": True}
    assert "fp8kv" not in cmp["row0_tokens_equal_across_variants"]
    assert cmp["row0_lossy_kv_agreement"]["fp8kv"]["reference"] == "invariant"
    only_fp8 = row0_comparison({"fp8kv": eng([1])}, "1")
    assert only_fp8 == {"row0_tokens_equal_across_variants": {}, "row0_lossy_kv_agreement": {}}
    assert token_agreement([1, 2, 3], [1, 2, 3]) == {
        "tokens": 3,
        "equal_fraction": 1.0,
        "first_mismatch": None,
    }
    assert token_agreement([5, 2], [1, 2, 3])["equal_fraction"] == 0.5


def test_table_lists_every_variant_and_the_roofline():
    dec = {"1": {"tok_s": 200.0}, "32": {"tok_s": 5000.0}}
    result = {
        "machine": {"gpu": "NVIDIA H200"},
        "weights": "random (bf16)",
        "bandwidth": {"gb_s": [4200.0, 4250.0]},
        "models": {
            "llama3-8b": {
                "weight_bytes": 16.06e9,
                "roofline_tok_s": 265.0,
                "engine": {
                    "invariant": {
                        "decode": dec,
                        "prefill": {"ttft_ms": 90.0, "prefill_tok_s": 22755.0},
                    },
                    "cublas": {"decode": dec},
                    "fp8kv": {"decode": {"1": {"tok_s": 230.0}}},
                },
                "row0_tokens_equal_across_variants": {"invariant": True, "cublas": True},
                "row0_lossy_kv_agreement": {
                    "fp8kv": {
                        "reference": "invariant",
                        "tokens": 131,
                        "equal_fraction": 0.25,
                        "first_mismatch": 30,
                    }
                },
                "hf": {
                    "eager": {"1": {"tok_s": 14.0}},
                    "prefill": {"ttft_ms": 300.0, "prefill_tok_s": 6800.0},
                },
            }
        },
    }
    text = table(result)
    assert "invariant" in text and "hf_eager" in text and "75.5" in text
    assert "roofline b1 265 tok/s" in text
    fp8_row = next(line for line in text.splitlines() if " fp8kv " in line)
    assert "230" in fp8_row and "86.8" in fp8_row
    assert "equal across invariant, cublas" in text
    assert "fp8kv vs invariant 25% equal (first differs at step 30" in text


def test_paged_decoder_fp8_cache_has_the_same_blocks(tiny_llama):
    from mmserve.bench.engine_run import PagedDecoder
    from mmserve.engine.kv_cache import KVCache

    model = tiny_llama("cpu")
    plain = PagedDecoder(model, 3, 40)
    fp8 = PagedDecoder(model, 3, 40, kv_dtype=FP8_DTYPE)
    assert isinstance(plain.kv, torch.Tensor) and plain.kv.dtype == torch.bfloat16
    assert plain.kv.shape == (2, 2, 1 + 3 * 3, 16, 2, 64)  # (L, 2, blocks, bs, Hkv, D)
    assert isinstance(fp8.kv, KVCache) and fp8.kv.dtype == FP8_DTYPE
    assert fp8.kv.data.shape == plain.kv.shape and fp8.kv.scales is not None
    assert fp8.kv_bytes == plain.kv_bytes // 128 * (64 + 4)  # D + 4 bytes vs 2 D per vector
    assert (fp8.tables == plain.tables).all()
    with pytest.raises(ValueError, match="fp8"):
        PagedDecoder(model, 3, 40, kv_dtype=torch.float16)


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_graph_decode_rows_equal_eager_and_single_sequence_harness(tiny_llama):
    from mmserve.bench.engine_run import BLOCK_SIZE, PagedDecoder
    from mmserve.models.harness import SequenceRunner

    model = tiny_llama()
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


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_fp8_cache_graph_decode_equals_eager(tiny_llama):
    from mmserve.bench.engine_run import PagedDecoder

    model = tiny_llama()
    prompts = torch.randint(0, 1000, (3, 21)).tolist()
    graphed = PagedDecoder(model, 4, 96, kv_dtype=FP8_DTYPE)
    graphed.capture((1, 2, 4))
    eager = PagedDecoder(model, 4, 96, kv_dtype=FP8_DTYPE)
    first = graphed.prefill(prompts)
    assert first == eager.prefill(prompts)
    assert graphed.kv.scales.abs().sum() > 0  # the prompt was written as scaled e4m3
    g = graphed.decode(first, 21, 8, graphs=True, warmup=0)
    e = eager.decode(first, 21, 8, graphs=False, warmup=0)
    assert g.row0 == e.row0


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_graph_decode_ahead_is_the_synchronous_decode(tiny_llama):
    """Steps launched from the last step's argmax on the device (the engine's async
    scheduling) give row 0 the tokens of the decode that reads every step first, at
    batch 1 and 3."""
    from mmserve.bench.engine_run import PagedDecoder

    model = tiny_llama()
    for b in (1, 3):
        prompts = torch.randint(0, 1000, (b, 21)).tolist()
        sync, ahead = PagedDecoder(model, 4, 96), PagedDecoder(model, 4, 96)
        sync.capture((1, 2, 4))
        ahead.capture((1, 2, 4))
        first = sync.prefill(prompts)
        assert ahead.prefill(prompts) == first
        s = sync.decode(first, 21, 9, graphs=True, warmup=2)
        a = ahead.decode(first, 21, 9, graphs=True, warmup=2, ahead=True)
        assert a.row0 == s.row0 and len(a.row0) == 11
        assert a.steps == 9 and a.seconds > 0
        assert torch.equal(ahead.kv, sync.kv)  # every step's keys and values where they were
