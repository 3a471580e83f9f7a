"""What an HF VLM directory says besides its weights: processor settings and chat template.

transformers 5 writes ``processor_config.json`` with the image processor nested under
``image_processor`` and the template in ``chat_template.jinja``; checkpoints saved by
transformers 4 (most on the hub) have ``preprocessor_config.json`` for the image processor,
a flat ``processor_config.json`` and ``chat_template.json``. Both layouts are read; the
processor's template wins over the tokenizer's, as in ``ProcessorMixin.apply_chat_template``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


@dataclass
class ProcessorFiles:
    image_processor: dict[str, Any]
    processor: dict[str, Any]  # image_seq_len, patch_size, image_token, ...
    chat_template: str | None
    # named special tokens of the tokenizer (``image_token``, ``fake_image_token``, ...)
    named_tokens: dict[str, str] = field(default_factory=dict)


def read_processor_files(model_dir: str | Path) -> ProcessorFiles:
    """The processor settings of ``model_dir``; an error naming the files when none exist."""
    model_dir = Path(model_dir)
    processor = _read(model_dir / "processor_config.json")
    image = processor.pop("image_processor", None) or _read(model_dir / "preprocessor_config.json")
    if not image:
        raise FileNotFoundError(
            f"{model_dir} has no image processor settings (processor_config.json with an "
            "'image_processor' entry, or preprocessor_config.json); save the checkpoint's "
            "processor with it"
        )
    template = processor.pop("chat_template", None)
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    elif template is None:
        template = _read(model_dir / "chat_template.json").get("chat_template")
    tokenizer = _read(model_dir / "tokenizer_config.json")
    if template is None and isinstance(tokenizer.get("chat_template"), str):
        template = tokenizer["chat_template"]
    extra = tokenizer.get("extra_special_tokens")
    named = (
        {k: v for k, v in extra.items() if isinstance(v, str)} if isinstance(extra, dict) else {}
    )
    return ProcessorFiles(image, processor, template, named)
