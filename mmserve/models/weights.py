"""Weights -> state dicts: safetensors model directories, and the tensors of GGUF files.

The state dict uses HF transformers parameter names (``model.layers.0.self_attn.q_proj.weight``).
Tied models have no ``lm_head.weight`` entry; ``config["tie_word_embeddings"]`` says to reuse
``model.embed_tokens.weight``. ``load_state_dict`` memory-maps the files, so pages are read from
the page cache as tensors are first touched.

``gguf_state_dict`` dequantizes a GGUF's tensors to float32 (``gguf.quants.dequantize``) and
undoes what llama.cpp's converter did to them:
- ``llama`` arch: Q and K rows were permuted per head (HF's half-split rotary layout ->
  interleaved pairs); they are permuted back.
- ``gemma3`` arch: every ``*norm.weight`` was stored as ``1 + w``; HF's Gemma RMSNorm computes
  ``x * (1 + w)`` itself, so 1 is subtracted.
- tied embeddings: llama.cpp writes no ``output.weight``; none is returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors import safe_open

from mmserve.errors import InvalidRequestError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def load_config(model_dir: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` of ``model_dir``."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json; is it a model directory?")
    with open(path, encoding="utf-8") as fh:
        config = json.load(fh)
    if not isinstance(config, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return config


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of ``model_dir``: the shards named by the index, else the single file."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        with open(index, encoding="utf-8") as fh:
            weight_map: dict[str, str] = json.load(fh)["weight_map"]
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    elif (model_dir / SINGLE_FILE).is_file():
        files = [model_dir / SINGLE_FILE]
    else:
        raise FileNotFoundError(f"{model_dir} has neither {SINGLE_FILE} nor {INDEX_FILE}.")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir} is missing weight shards: {', '.join(missing)}")
    return files


def load_state_dict(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    names: Callable[[str], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of ``model_dir`` (those ``names`` accepts, default all); floating-point ones
    cast to ``dtype``, others kept as is."""
    state: dict[str, torch.Tensor] = {}
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if names is not None and not names(name):
                    continue
                tensor = fh.get_tensor(name)
                if tensor.is_floating_point() and tensor.dtype != dtype:
                    tensor = tensor.to(dtype)
                state[name] = tensor.to(device) if str(device) != "cpu" else tensor
    return state


# ---- GGUF tensors ------------------------------------------------------------------------

_COMMON_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAMES = {
    "llama": _COMMON_NAMES | {"ffn_norm": "post_attention_layernorm"},
    "gemma3": _COMMON_NAMES
    | {
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_tensor_name(arch: str, gguf_name: str) -> str:
    """The HF transformers parameter name of one GGUF tensor; unknown names are an error."""
    if m := _BLOCK_RE.match(gguf_name):
        layer, part, kind = m.groups()
        if part in (block := _BLOCK_NAMES.get(arch, {})):
            return f"model.layers.{layer}.{block[part]}.{kind}"
    else:
        stem, _, kind = gguf_name.rpartition(".")
        if stem in _TOP_NAMES:
            return f"{_TOP_NAMES[stem]}.{kind}"
    raise InvalidRequestError(
        f"GGUF tensor {gguf_name!r} has no HF equivalent for architecture {arch!r}; "
        "this GGUF variant is not supported."
    )


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's per-head Q/K row permutation (its ``LlamaModel.permute``)."""
    rows = w.shape[0]
    # (n_head, head_dim/2, 2, in) -> (n_head, 2, head_dim/2, in): interleaved pairs -> two halves
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor_fixer(arch: str, config: dict[str, Any]) -> Callable[[str, np.ndarray], np.ndarray]:
    """The per-architecture undo of llama.cpp's weight transforms (module docstring)."""

    def fix(name: str, w: np.ndarray) -> np.ndarray:
        if arch == "llama" and name.endswith(".attn_q.weight"):
            return unpermute_rotary(w, config["num_attention_heads"])
        if arch == "llama" and name.endswith(".attn_k.weight"):
            return unpermute_rotary(w, config["num_key_value_heads"])
        if arch == "gemma3" and name.endswith("norm.weight"):
            return w - np.float32(1.0)
        return w

    return fix


def gguf_state_dict(
    reader: gguf.GGUFReader,
    config: dict[str, Any],
    on_tensor: Callable[[], object] = lambda: None,
) -> dict[str, torch.Tensor]:
    """Every GGUF tensor in float32 under its HF name (Linear weights (out, in)), with llama.cpp's
    transforms undone; ``config`` is the converted HF config; ``on_tensor`` ticks progress."""
    arch = str(reader.fields["general.architecture"].contents())
    fix = _tensor_fixer(arch, config)
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = fix(t.name, w.reshape([int(d) for d in reversed(t.shape)]))
        # unquantized tensors come back as read-only views of the memory-mapped file
        w = np.ascontiguousarray(w) if w.flags.writeable else w.copy()
        out[hf_tensor_name(arch, t.name)] = torch.from_numpy(w)
        on_tensor()
    if config.get("tie_word_embeddings"):
        out.pop("lm_head.weight", None)
    return out
