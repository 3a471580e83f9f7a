"""Which connector to serve, and loading it: the engine's half and the API server's half.

``EngineConfig.connector`` (``--connector``) names it: ``auto`` (the default: the shipped
offline connector when the served LM is the one it was trained for, else none),
``none``, or a directory. A directory is loaded by the first entry of ``LOADERS`` that
claims it (the timm connector format here; VLM checkpoint families add theirs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from connectors.base import Connector, ImageProcessor

DEFAULT_DIR = Path(__file__).resolve().parent / "default"


@dataclass(frozen=True)
class Loader:
    """A connector directory format: ``claims(path)``, then its two halves."""

    name: str
    claims: Callable[[Path], bool]
    connector: Callable[[Path, Any, torch.device, torch.dtype], Connector]
    processor: Callable[[Path, Any], ImageProcessor]


def _timm_loader() -> Loader:
    from connectors import timm_connector as t

    return Loader("timm", t.is_timm_connector, t.load_connector, t.load_processor)


def _checkpoint_loader() -> Loader:
    from connectors import checkpoints as c

    return Loader(
        "vlm-checkpoint",
        c.is_vlm_dir,
        lambda path, tok, device, dtype: c.load_connector(path, device, dtype, tok),
        lambda path, tok: c.load_processor(path, tok),
    )


LOADERS: list[Callable[[], Loader]] = [_timm_loader, _checkpoint_loader]


def resolve_connector(
    connector: str | None, model_name: str, model_path: Path | None = None
) -> Path | None:
    """The connector directory to serve with LM ``model_name`` (loaded from ``model_path``),
    or None (text only). ``auto``: a VLM checkpoint's own vision side, else the shipped
    default when the LM is the one it was trained for."""
    if connector in (None, "", "none"):
        return None
    if connector == "auto" and model_path is not None:
        from connectors.checkpoints import is_vlm_dir

        if is_vlm_dir(model_path):
            return model_path
    if connector == "auto":
        if not (DEFAULT_DIR / "config.json").is_file():
            return None
        import json

        trained_for = json.loads((DEFAULT_DIR / "config.json").read_text()).get("lm")
        return DEFAULT_DIR if trained_for == model_name else None
    path = Path(connector).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"connector {connector!r} is not a directory; give a connector "
            f"directory, 'auto' or 'none'"
        )
    return path


def _loader(path: Path) -> Loader:
    for make in LOADERS:
        loader = make()
        if loader.claims(path):
            return loader
    raise ValueError(
        f"{path} is not a connector directory any loader knows "
        f"({', '.join(m().name for m in LOADERS)})"
    )


def load_connector(
    path: Path, tokenizer: Any, device: torch.device, dtype: torch.dtype
) -> Connector:
    return _loader(path).connector(path, tokenizer, device, dtype)


def load_processor(path: Path, tokenizer: Any) -> ImageProcessor:
    return _loader(path).processor(path, tokenizer)
