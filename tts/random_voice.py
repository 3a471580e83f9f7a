"""Voices with random weights, for tests and benchmarks (speed does not depend on values).

- ``random_snac``: a SNAC decoder of any width with weight-norm-shaped random weights.
- ``orpheus_tokenizer_json``: a tokenizer with Orpheus's ids (Llama-3's specials at
  128000.., ``<custom_token_N>`` at 128256 + N), words mapped to one id.
- ``planted_orpheus_voice``: an Orpheus-shaped checkpoint (Llama, vocabulary 156,940,
  SNAC next to it) whose output after the Orpheus prompt is a chosen token sequence: each
  planted token's LM-head row is the (normalised) embedding of the token before it, the
  layers' weights are tiny, so the model continues any planted token with its successor by
  a wide margin, even when sampling. That makes "text -> engine tokens -> frames -> PCM"
  checkable against a known answer.
- ``random_phoneme_voice``: the default voice's kind with a random tiny backbone and codec.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tts.snac import SNAC, SNACConfig

ORPHEUS_VOCAB = 156940


def random_snac(cfg: SNACConfig, seed: int = 0) -> SNAC:
    """Random weights scaled so the output is speech-loud (std ~0.05) and unsaturated."""
    g = torch.Generator().manual_seed(seed)
    model = SNAC(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif p.dim() > 1:
                p.copy_(0.5 * torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            else:
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
        last = model.decoder.model[-1]
        assert isinstance(last.weight, torch.Tensor)
        last.weight.mul_(10.0)
    return model.eval()


def save_snac(model: SNAC, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(model.cfg.to_json())
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors")
    )


def orpheus_tokenizer_json() -> str:
    names = [f"<t{i}>" for i in range(128000)]
    names += [f"<|reserved_special_token_{i}|>" for i in range(256)]
    names[128000], names[128001], names[128009] = (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|eot_id|>",
    )
    names += [f"<custom_token_{n}>" for n in range(ORPHEUS_VOCAB - 128256)]
    added = [
        {
            "id": i,
            "content": names[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i in range(128000, ORPHEUS_VOCAB)
    ]
    return json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                "special_tokens": {
                    "<|begin_of_text|>": {
                        "id": "<|begin_of_text|>",
                        "ids": [128000],
                        "tokens": ["<|begin_of_text|>"],
                    }
                },
            },
            "decoder": None,
            "model": {
                "type": "WordLevel",
                "vocab": {n: i for i, n in enumerate(names)},
                "unk_token": "<t0>",
            },
        }
    )


def planted_orpheus_voice(
    out: Path, sequence: list[int], hidden: int = 128, snac: SNACConfig | None = None, seed: int = 0
) -> Path:
    """An Orpheus-shaped voice in ``out`` that answers any prompt (ending in
    start_of_speech 128257) with ``sequence`` (distinct token ids)."""
    from safetensors.torch import save_file

    from mmserve.models.llama import hf_tensor_shapes

    assert len(set(sequence)) == len(sequence), "planted tokens must be distinct"
    cfg = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "intermediate_size": 2 * hidden,
        "vocab_size": ORPHEUS_VOCAB,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 4096,
    }
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in hf_tensor_shapes(cfg).items():
        sd[name] = (
            torch.ones(shape)
            if name.endswith("norm.weight")
            else 1e-3 * torch.randn(shape, generator=g)
        )
    emb = torch.randn(ORPHEUS_VOCAB, hidden, generator=g)
    head = torch.zeros(ORPHEUS_VOCAB, hidden)
    for prev, nxt in zip([128257, *sequence[:-1]], sequence, strict=True):
        head[nxt] = emb[prev] / emb[prev].norm()
    sd["model.embed_tokens.weight"], sd["lm_head.weight"] = emb, head
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.float16).contiguous() for k, v in sd.items()}, str(out / "model.safetensors")
    )
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "tokenizer.json").write_text(orpheus_tokenizer_json())
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    )
    save_snac(random_snac(snac or SNACConfig(encoder_dim=4, decoder_dim=64), seed), out / "snac")
    return out


def random_phoneme_voice(out: Path, frames_per_phoneme: int = 1, seed: int = 0) -> Path:
    """A tiny random voice of the default voice's kind whose every output token is a code
    (its LM head is zero outside the codes), so each piece speaks exactly its
    ``max_tokens`` frames."""
    from tts.framecodec import FrameCodec, FrameCodecConfig
    from tts.phoneme_voice import PhonemeVocab
    from tts.train.backbone import save_backbone
    from tts.train.llama import TrainLlama, llama_config

    torch.manual_seed(seed)
    codec = FrameCodec(FrameCodecConfig(dec_dim=32, enc_dim=32, dilations=(1, 2)))
    codec.save(out / "codec")
    vocab = PhonemeVocab([], 64, codec.codebook_size)
    mcfg = llama_config("small", vocab.size) | {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "intermediate_size": 128,
        "tie_word_embeddings": False,
    }
    model = TrainLlama(mcfg)
    save_backbone(model, mcfg, vocab, out)
    _codes_only_head(out, vocab.code_base, seed)
    meta = {
        "kind": "phoneme-frame",
        "name": "random",
        "symbols": vocab.symbols,
        "num_q": vocab.num_q,
        "codebook": vocab.codebook,
        "codec": "codec",
        "temperature": 0.0,
        "max_frames_per_phoneme": frames_per_phoneme,
        "frame_slack": 2,
    }
    (out / "voice.json").write_text(json.dumps(meta))
    return out


def _codes_only_head(out: Path, code_base: int, seed: int) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(out / "model.safetensors"))
    emb = sd["model.embed_tokens.weight"]
    head = torch.zeros_like(emb)
    g = torch.Generator().manual_seed(seed)
    head[code_base:] = torch.randn(head[code_base:].shape, generator=g).to(head.dtype)
    sd["lm_head.weight"] = head
    save_file(sd, str(out / "model.safetensors"))
