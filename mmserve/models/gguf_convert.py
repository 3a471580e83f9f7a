"""GGUF file -> HF-style model directory, readable by mmserve and by HF transformers alike.

Writes ``config.json`` (from the GGUF metadata, HF names and conventions), ``model.safetensors``
(float32, see ``weights.gguf_state_dict`` for the llama.cpp transforms undone),
``tokenizer.json`` (see ``tokenizer.build_gguf_backend``), ``tokenizer_config.json`` (chat
template, special tokens, added tokens) and ``generation_config.json`` (stop ids).

Contract: ``convert_gguf(gguf, out_dir)`` either leaves a complete directory at ``out_dir`` or
leaves ``out_dir`` untouched. Everything is written into a sibling temp directory, the completion
marker (``MARKER_NAME``, JSON) is written last, and the directory is renamed into place, so a
reader that finds the marker finds every file it lists, at the size it lists.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import tokenizers
from safetensors.torch import save_file
from tqdm.auto import tqdm

from mmserve.errors import InvalidRequestError
from mmserve.models.tokenizer import build_gguf_backend, gguf_adds_bos_eos, special_token_ids
from mmserve.models.weights import gguf_state_dict

# Bump whenever the output of the conversion changes; cached directories are then rebuilt.
CONVERTER_VERSION = 1
MARKER_NAME = "mmserve-complete.json"


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """All GGUF key/value fields as plain Python values (arrays become lists)."""
    return {key: field.contents() for key, field in reader.fields.items()}


def _f32(x: float) -> float:
    # GGUF stores float32; its shortest repr (1e-05, not 9.99999974e-06) is what HF configs hold
    return float(str(np.float32(x)))


def _rope_scaling(meta: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind not in ("linear", "yarn"):
        raise InvalidRequestError(f"GGUF rope scaling type {kind!r} is not supported.")
    scaling = {"rope_type": kind, "factor": _f32(meta[f"{arch}.rope.scaling.factor"])}
    if (orig := meta.get(f"{arch}.rope.scaling.original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    return scaling


_REQUIRED = object()


def _arch_key(meta: dict[str, Any], arch: str) -> Callable[..., Any]:
    """``key(name[, default])``: the value of ``<arch>.<name>``; a missing required key is an
    error naming it."""

    def key(name: str, default: Any = _REQUIRED) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is _REQUIRED:
            raise InvalidRequestError(f"GGUF metadata lacks {arch}.{name}; the file is incomplete.")
        return value

    return key


def _base_config(meta: dict[str, Any], arch: str, tensor_names: set[str]) -> dict[str, Any]:
    key = _arch_key(meta, arch)
    n_head, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    head_dim = key("attention.key_length", key("rope.dimension_count", hidden // n_head))
    return {
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(key("attention.head_count_kv", n_head)),
        "head_dim": int(head_dim),
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(key("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(meta, arch),
        "vocab_size": int(key("vocab_size", len(meta["tokenizer.ggml.tokens"]))),
        # llama.cpp writes output.weight only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _llama_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    cfg = _base_config(meta, "llama", tensor_names)
    return (
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
        | cfg
        | {
            "hidden_act": "silu",
            "mlp_bias": False,
        }
    )


def _gemma3_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    cfg = _base_config(meta, "gemma3", tensor_names)
    layers = cfg["num_hidden_layers"]
    # llama.cpp hard-codes the pattern (every 6th layer global) unless the file states it
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # newer files: one is-sliding flag per layer
        sliding = [bool(x) for x in pattern]
        pattern = sliding.index(False) + 1 if False in sliding else layers
    else:
        sliding = [(i + 1) % int(pattern) != 0 for i in range(layers)]
    # only the 27B model (62 layers) scales queries by hidden/heads instead of head_dim
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if layers == 62 else cfg["head_dim"]
    return (
        {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}
        | cfg
        | {
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": scalar,
            "sliding_window": int(meta["gemma3.attention.sliding_window"]),
            "sliding_window_pattern": int(pattern),
            "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
            "rope_local_base_freq": 10000.0,
            "final_logit_softcapping": meta.get("gemma3.final_logit_softcapping"),
            "attn_logit_softcapping": meta.get("gemma3.attn_logit_softcapping"),
            "use_bidirectional_attention": False,
        }
    )


_CONFIG_BUILDERS = {"llama": _llama_config, "gemma3": _gemma3_config}


def build_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """HF ``config.json`` contents for this GGUF; unsupported architectures are an error."""
    arch = meta["general.architecture"]
    if arch not in _CONFIG_BUILDERS:
        raise InvalidRequestError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(_CONFIG_BUILDERS)}."
        )
    return _CONFIG_BUILDERS[arch](meta, tensor_names)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


_CONTROL = 3  # llama.cpp token type
_EOG_TEXTS = {"<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>"}


def _stop_token_ids(meta: dict[str, Any]) -> list[int]:
    """llama.cpp's end-of-generation set: eos, eot/eom, and control tokens that end turns."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    ids = {meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
    ids |= {i for i, kind in enumerate(types) if kind == _CONTROL and tokens[i] in _EOG_TEXTS}
    return sorted(int(i) for i in ids if i is not None)


def _write_tokenizer(
    out: Path, meta: dict[str, Any], config: dict[str, Any], backend: tokenizers.Tokenizer
) -> None:
    """tokenizer.json, tokenizer_config.json and generation_config.json, HF-style."""
    backend.save(str(out / "tokenizer.json"))
    ids, tokens = special_token_ids(meta), meta["tokenizer.ggml.tokens"]
    add_bos, add_eos = gguf_adds_bos_eos(meta)
    fields = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    added = {
        str(i): {f: getattr(t, f) for f in fields}
        for i, t in sorted(backend.get_added_tokens_decoder().items())
    }
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **{f"{n}_token": (tokens[i] if i is not None else None) for n, i in ids.items()},
            "add_bos_token": add_bos,
            "add_eos_token": add_eos,
            "clean_up_tokenization_spaces": False,
            "model_max_length": config["max_position_embeddings"],
            "chat_template": meta.get("tokenizer.chat_template"),
            "added_tokens_decoder": added,
        },
    )
    stops = _stop_token_ids(meta)
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": ids["bos"],
            "eos_token_id": stops,
            "pad_token_id": ids["pad"],
        },
    )


def write_marker(model_dir: Path, source: dict[str, Any]) -> None:
    """Write the completion marker: converter version, source hashes and every file's size."""
    files = {
        p.name: p.stat().st_size
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name != MARKER_NAME
    }
    marker = {"converter_version": CONVERTER_VERSION, "source": source, "files": files}
    _write_json(model_dir / MARKER_NAME, marker)


def read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        with open(directory / MARKER_NAME, encoding="utf-8") as fh:
            marker = json.load(fh)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_complete(directory: Path, gguf_sha256: str) -> bool:
    """Marker present, same converter and source GGUF, every listed file at its listed size."""
    marker = read_marker(directory)
    if marker is None or marker.get("converter_version") != CONVERTER_VERSION:
        return False
    if marker.get("source", {}).get("gguf_sha256") != gguf_sha256:
        return False
    files = marker.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        return False
    for name, size in files.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _finalize_files(d: Path) -> None:
    """fsync every file, and give the directory and files the usual umask-based modes
    (mkdtemp makes the directory private, and safetensors writes 0600 files)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(d, 0o777 & ~umask)
    for p in d.iterdir():
        os.chmod(p, 0o666 & ~umask)
        with open(p, "rb") as fh:
            os.fsync(fh.fileno())


def _install(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``, moving an old ``out_dir`` aside first and deleting it."""
    if out_dir.exists():
        trash = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.rename(out_dir, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, out_dir)


def convert_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    source: dict[str, Any] | None = None,
    progress: bool = True,
) -> Path:
    """Convert ``gguf_path`` into ``out_dir`` atomically; ``source`` goes into the marker."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(desc=f"Converting {gguf_path.name}", unit="tensor", disable=not progress)
    bar.set_postfix_str("reading metadata")  # a large vocabulary takes seconds to parse
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        with bar:
            reader = gguf.GGUFReader(gguf_path)
            meta = read_metadata(reader)
            config = build_config(meta, {t.name for t in reader.tensors})
            bar.reset(total=len(reader.tensors) + 1)
            bar.set_postfix_str("dequantizing")
            tensors = gguf_state_dict(reader, config, on_tensor=lambda: bar.update(1))
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            del tensors
            bar.set_postfix_str("tokenizer")
            _write_tokenizer(tmp, meta, config, build_gguf_backend(meta))
            _write_json(tmp / "config.json", config)
            bar.update(1)
            bar.set_postfix_str("done")
        _finalize_files(tmp)
        write_marker(tmp, source or {})
        _install(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
