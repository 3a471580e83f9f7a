"""GGUF conversion and weight loading, checked against transformers' own GGUF loader.

The reference is ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` on the very GGUF we
converted (it dequantizes with the same ``gguf`` package and undoes the same llama.cpp
transforms), so tensors must match exactly. Loading our directory with transformers and comparing
logits checks that config.json means the same model as the GGUF metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from mmserve.errors import InvalidRequestError
from mmserve.models.tokenizer import Tokenizer
from mmserve.models.weights import hf_tensor_name, load_config, load_state_dict, unpermute_rotary

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF files")

IDS = [[2, 651, 6037, 576, 6081, 603, 108, 1841, 10, 25, 7, 9000, 17, 4]]


def _hf_from_gguf(gguf_path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


def _next_token(model: torch.nn.Module, model_dir: Path, prompt: str) -> str:
    tok = Tokenizer(model_dir)
    ids = tok.encode(prompt, add_special_tokens=True)
    with torch.no_grad():
        return tok.decode([int(model(torch.tensor([ids])).logits[0, -1].argmax())])


def _check_against_transformers(model_dir: Path, gguf_path: Path) -> Any:
    """Assert our directory equals transformers' GGUF load; return transformers' load of it."""
    ref = _hf_from_gguf(gguf_path)
    ref_sd = ref.state_dict()
    ours = load_state_dict(model_dir)
    config = load_config(model_dir)
    assert config["tie_word_embeddings"] == ref.config.tie_word_embeddings
    expected = set(ref_sd) - ({"lm_head.weight"} if config["tie_word_embeddings"] else set())
    assert set(ours) == expected
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, ref_sd[name]), name
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "vocab_size",
    ):
        assert config[key] == getattr(ref.config, key), key
    assert config["rms_norm_eps"] == pytest.approx(ref.config.rms_norm_eps, rel=1e-6)
    ours_hf = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    assert ours_hf.config.rope_parameters == ref.config.rope_parameters
    with torch.no_grad():
        want = ref(torch.tensor(IDS)).logits
        got = ours_hf.eval()(torch.tensor(IDS)).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    return ours_hf


def test_smollm2_matches_transformers_gguf_loader(default_model_dir, default_gguf):
    model = _check_against_transformers(default_model_dir, default_gguf)
    # independent of transformers' GGUF code: the converted model still knows things
    assert _next_token(model, default_model_dir, "The capital of France is") == " Paris"
    config = load_config(default_model_dir)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["rope_theta"] == 100000.0 and config["rms_norm_eps"] == 1e-5


def test_gemma3_matches_transformers_gguf_loader(gemma_model_dir, gemma_gguf):
    model = _check_against_transformers(gemma_model_dir, gemma_gguf)
    # Independent check of the norm fix (stored 1 + w, HF computes (1 + w) itself): with the
    # +1 left in, this base model answers with noise instead of the next weekday.
    assert _next_token(model, gemma_model_dir, "Monday, Tuesday, Wednesday,") == " Thursday"
    config = load_config(gemma_model_dir)
    assert config["model_type"] == "gemma3_text"
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["sliding_window"] == 512 and config["query_pre_attn_scalar"] == 256
    assert config["layer_types"].count("full_attention") == 3
    assert config["layer_types"][5] == "full_attention"
    assert (config["rope_theta"], config["rope_local_base_freq"]) == (1e6, 1e4)


def test_unpermute_inverts_llama_cpp_permute():
    n_head, head_dim, d_in = 3, 8, 5
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, d_in)).astype(np.float32)
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    permuted = w.reshape(n_head, 2, head_dim // 2, d_in).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_rotary(permuted, n_head), w)


def test_unknown_gguf_tensor_is_an_error():
    assert hf_tensor_name("llama", "blk.3.ffn_norm.weight") == (
        "model.layers.3.post_attention_layernorm.weight"
    )
    with pytest.raises(InvalidRequestError, match="rope_freqs"):
        hf_tensor_name("llama", "rope_freqs.weight")


def test_sharded_safetensors_and_dtype(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {f"layer.{i}.weight": torch.randn(4, 3, generator=gen) for i in range(4)}
    tensors["step"] = torch.tensor([7], dtype=torch.int64)
    shards = {
        "model-00001-of-00002.safetensors": ["layer.0.weight", "layer.1.weight"],
        "model-00002-of-00002.safetensors": ["layer.2.weight", "layer.3.weight", "step"],
    }
    for file, names in shards.items():
        save_file({n: tensors[n] for n in names}, str(tmp_path / file))
    weight_map = {n: file for file, names in shards.items() for n in names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_state_dict(tmp_path, dtype=torch.bfloat16)
    assert set(loaded) == set(tensors)
    assert loaded["step"].dtype == torch.int64 and loaded["layer.2.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(
        loaded["layer.3.weight"].float(), tensors["layer.3.weight"], rtol=1e-2, atol=1e-2
    )
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="missing weight shards"):
        load_state_dict(tmp_path)


def test_missing_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_state_dict(tmp_path)
