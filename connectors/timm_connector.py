"""The timm connector: frozen timm encoder + trained projector, saved as a directory.

    DIR/config.json            ConnectorConfig (below)
    DIR/encoder.safetensors    the timm model's weights (frozen)
    DIR/projector.safetensors  the projector's weights (the only trained part)

Image tokens per image are fixed by the config: ``tokens_per_tile`` =
``projector.num_tokens(patch grid)`` for each tile, and a large image is cut into at
most ``max_tiles`` tiles plus one global view (no tiles when ``max_tiles`` is 1, or
when the image fits one tile). Tiles are separated by ``tile_separator`` tokens that
keep their token embeddings. ``TimmProcessor.prepare`` decides the tiles and the
tokens together, so their counts always agree with ``TimmConnector.encode``.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from connectors.base import (
    WARM_BATCHES,
    Connector,
    ImageProcessor,
    ImageTokens,
    PreparedImage,
)
from connectors.encoder import (
    EncoderSpec,
    Preprocess,
    TimmEncoder,
    create_encoder_model,
    data_config,
)
from connectors.projector import Projector, ProjectorSpec

FORMAT = "mmserve-timm-connector"


@dataclass
class ConnectorConfig:
    encoder: EncoderSpec
    projector: ProjectorSpec
    grid: tuple[int, int]  # the encoder's patch grid for one tile
    placeholder: str = "<|endoftext|>"  # the token text standing at embedded positions
    tile_separator: str = "\n"  # text between tiles (keeps its token embeddings)
    max_tiles: int = 1
    lm: str | None = None  # the LM the projector was trained for (its name)
    prompt: str = "Describe the image."  # the caption instruction it was trained with
    extra: dict[str, Any] = field(default_factory=dict)  # training provenance

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderSpec(**self.encoder)
        if isinstance(self.projector, dict):
            self.projector = ProjectorSpec(**self.projector)
        self.grid = (int(self.grid[0]), int(self.grid[1]))
        if self.max_tiles < 1:
            raise ValueError(f"max_tiles must be >= 1, got {self.max_tiles}")

    @property
    def tokens_per_tile(self) -> int:
        return self.projector.num_tokens(self.grid)

    def save(self, path: Path) -> None:
        data = {"format": FORMAT, **asdict(self)}
        (path / "config.json").write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ConnectorConfig:
        data = json.loads((Path(path) / "config.json").read_text())
        if data.pop("format", None) != FORMAT:
            raise ValueError(f"{path} is not an mmserve timm connector (config.json format)")
        return cls(**data)


def is_timm_connector(path: str | Path) -> bool:
    cfg = Path(path) / "config.json"
    return cfg.is_file() and json.loads(cfg.read_text()).get("format") == FORMAT


class TimmProcessor(ImageProcessor):
    """Image -> tiles (timm's eval preprocessing each) + their image tokens."""

    def __init__(self, config: ConnectorConfig, preprocess: Preprocess, token_id: Any) -> None:
        self.config, self.preprocess = config, preprocess
        self.placeholder_id: int = token_id(config.placeholder)
        self.separator_ids: tuple[int, ...] = tuple(token_id.encode(config.tile_separator))
        cfg = preprocess.cfg
        # for them timm's resize and crop are the identity (crop_pct 1)
        self._identity_crop = cfg.get("crop_pct", 1.0) == 1.0 and cfg.get(
            "crop_mode", "center"
        ) in ("center", "squash")
        # an image at the tile size is keyed by its RGB bytes under this preprocessing
        self._salt = json.dumps(cfg, sort_keys=True, default=str).encode()

    def tile_grid(self, image: Image.Image) -> tuple[int, int]:
        """(rows, cols) of tiles for ``image``: (1, 1) = the global view alone. Of the grids
        with at most ``max_tiles`` tiles and no more than the image's size needs, the one
        whose aspect ratio is nearest the image's (more tiles on a tie)."""
        th, tw = self.preprocess.size
        w, h = image.size
        need_r, need_c = math.ceil(h / th), math.ceil(w / tw)
        grids = [
            (r, c)
            for r in range(1, need_r + 1)
            for c in range(1, need_c + 1)
            if r * c <= self.config.max_tiles
        ]
        target = math.log(w / h)
        return min(
            grids,
            key=lambda g: (round(abs(math.log(g[1] * tw / (g[0] * th)) - target), 9), -g[0] * g[1]),
        )

    def prepare(self, image: Image.Image) -> PreparedImage:
        if self._at_tile_size(image):
            return self.prepare_many([image])[0]
        rows, cols = self.tile_grid(image)
        views = []
        if rows * cols > 1:
            th, tw = self.preprocess.size
            big = image.resize((cols * tw, rows * th), Image.Resampling.BICUBIC)
            views = [
                big.crop((c * tw, r * th, (c + 1) * tw, (r + 1) * th))
                for r in range(rows)
                for c in range(cols)
            ]
        views.append(image)  # the global view, always last
        pixels = torch.stack([self.preprocess(v) for v in views])  # (T, C, H, W)
        return PreparedImage(pixels, self.tokens(len(views)))

    def _at_tile_size(self, image: Image.Image) -> bool:
        th, tw = self.preprocess.size
        return self._identity_crop and image.mode == "RGB" and image.size == (tw, th)

    def prepare_many(self, images: Sequence[Image.Image]) -> list[PreparedImage]:
        """``prepare`` for each; the images already at the tile size are normalized in one
        batched op (``Preprocess.normalize_uint8``: ToTensor + Normalize's float32
        arithmetic, op for op, so the pixels equal timm's transform's bit for bit) and
        keyed by a digest of their RGB bytes (a quarter of the float pixels' to hash)."""
        batch = [i for i, im in enumerate(images) if self._at_tile_size(im)]
        out: list[PreparedImage | None] = [None] * len(images)
        if batch:
            u8 = np.stack([np.asarray(images[i]) for i in batch])
            pixels = self.preprocess.normalize_uint8(torch.from_numpy(u8))
            tokens = self.tokens(1)
            for row, i in enumerate(batch):
                digest = hashlib.blake2b(self._salt + u8[row].tobytes(), digest_size=16).digest()
                out[i] = PreparedImage(pixels[row : row + 1], tokens, digest)
        return [p if p is not None else self.prepare(im) for p, im in zip(out, images, strict=True)]

    def tokens(self, num_views: int) -> ImageTokens:
        n, sep = self.config.tokens_per_tile, self.separator_ids
        ids: list[int] = []
        flags: list[bool] = []
        for v in range(num_views):
            if v:
                ids += sep
                flags += [False] * len(sep)
            ids += [self.placeholder_id] * n
            flags += [True] * n
        return ImageTokens(tuple(ids), tuple(flags))


class _TokenIds:
    """A tokenizer's ``(text) -> single id`` and ``encode`` for the processor."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    def __call__(self, text: str) -> int:
        ids = self.tok.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"the placeholder {text!r} must be one token; it is {ids}")
        return int(ids[0])

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False)) if text else []


class TimmConnector(Connector):
    """Frozen timm encoder + projector on one device, in the LM's dtype.

    Tiles go through the encoder in chunks of exactly ``chunk`` (the last one padded with
    zeros): every tile is computed by the same kernels whatever else is in the batch, so
    an image's embeddings do not depend on the step it was encoded in (batch invariance:
    the same captions at any concurrency, and a cached encoding equals a fresh one).

    On CUDA, ``warm_up`` records one chunk through encoder + projector as a CUDA graph
    (``capture_graph``): the encoder is a few dozen small kernels whose launches, not
    their math, are its cost, and it runs inside an engine step. A replay runs the very
    kernels the eager chunk does on the same shapes, so its rows are the eager rows.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        encoder: TimmEncoder,
        projector: Projector,
        processor: TimmProcessor | None,
        device: torch.device,
        dtype: torch.dtype,
        chunk: int = 16,
    ) -> None:
        self.config, self.processor = config, processor  # type: ignore[assignment]
        self.encoder = encoder.to(device=device, dtype=dtype).eval()
        self.projector = projector.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.hidden_size = config.projector.out_dim
        self.device, self.dtype, self.chunk = device, dtype, chunk
        # (graph, static input chunk, static output chunk) once captured
        self._graph: tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor] | None = None
        self._graph_lock = threading.Lock()

    def _chunk(self, tiles: torch.Tensor) -> torch.Tensor:
        return self.projector(self.encoder(tiles))

    @torch.inference_mode()
    def encode(self, payloads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        tiles = torch.cat(list(payloads))
        if self.device.type == "cuda":
            # a copy from pageable memory (or one that converts on the way) would first
            # wait for the steps queued; from pinned memory, in the tiles' final dtype (the
            # same rounding on either side), it queues behind them
            tiles = tiles.to(self.dtype).pin_memory()
        tiles = tiles.to(self.device, self.dtype, non_blocking=True)
        n = tiles.shape[0]
        pad = -n % self.chunk
        if pad:
            tiles = torch.cat([tiles, tiles.new_zeros(pad, *tiles.shape[1:])])
        chunks = [tiles[i : i + self.chunk] for i in range(0, tiles.shape[0], self.chunk)]
        if self._graph is not None and chunks[0].shape == self._graph[1].shape:
            graph, static_in, static_out = self._graph
            outs = []
            with self._graph_lock:  # one set of static buffers
                for c in chunks:
                    static_in.copy_(c)
                    graph.replay()
                    outs.append(static_out.clone())  # the next replay overwrites static_out
        else:
            outs = [self._chunk(c) for c in chunks]
        flat = (torch.cat(outs) if len(outs) > 1 else outs[0])[:n]  # (sum T, n, D)
        sizes = [p.shape[0] for p in payloads]
        return [t.reshape(-1, flat.shape[-1]) for t in flat.split(sizes)]

    def warm_up(self, batches: Sequence[int] = WARM_BATCHES) -> None:
        super().warm_up(batches)  # eager first: kernels loaded, GEMM algorithms chosen
        if self.device.type == "cuda":
            self.capture_graph()

    @torch.inference_mode()
    def capture_graph(self) -> None:
        """Record one ``chunk`` of tiles through encoder + projector (CUDA only)."""
        assert self.device.type == "cuda", "CUDA graphs need a CUDA device"
        tile = self.processor.prepare(Image.new("RGB", (64, 64))).pixels.shape[1:]
        static_in = torch.zeros(self.chunk, *tile, device=self.device, dtype=self.dtype)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # side-stream warm-up, as graph capture requires
                self._chunk(static_in)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self._chunk(static_in)
        self._graph = (graph, static_in, static_out)


def build_modules(
    config: ConnectorConfig, directory: Path | None = None
) -> tuple[TimmEncoder, Projector, Preprocess]:
    """Encoder (weights from ``directory`` or ``config.encoder.file``), projector (weights
    from ``directory`` when present), preprocessing."""
    spec = config.encoder
    if directory is not None and (directory / "encoder.safetensors").is_file():
        spec = EncoderSpec(
            spec.name, spec.kwargs, str(directory / "encoder.safetensors"), spec.data
        )
    model = create_encoder_model(spec)
    encoder = TimmEncoder(model)
    projector = Projector(config.projector)
    if directory is not None and (directory / "projector.safetensors").is_file():
        projector.load_state_dict(load_file(str(directory / "projector.safetensors")))
    return encoder, projector, Preprocess(data_config(model, config.encoder))


def load_processor(path: str | Path, tokenizer: Any) -> TimmProcessor:
    """The CPU half alone (an API-server process needs no weights)."""
    config = ConnectorConfig.load(Path(path))
    model = create_encoder_model(
        EncoderSpec(config.encoder.name, config.encoder.kwargs, None, config.encoder.data)
    )
    return TimmProcessor(
        config, Preprocess(data_config(model, config.encoder)), _TokenIds(tokenizer)
    )


def load_connector(
    path: str | Path, tokenizer: Any, device: torch.device, dtype: torch.dtype
) -> TimmConnector:
    path = Path(path)
    config = ConnectorConfig.load(path)
    encoder, projector, preprocess = build_modules(config, path)
    processor = TimmProcessor(config, preprocess, _TokenIds(tokenizer))
    return TimmConnector(config, encoder, projector, processor, device, dtype)


def save_connector(
    path: str | Path,
    config: ConnectorConfig,
    encoder: TimmEncoder,
    projector: Projector,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """Write the directory; floating weights stored in ``dtype`` (bf16: half the bytes; the
    served model is the stored one, so evaluate what was saved)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    def cast(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous().cpu()
            for k, v in sd.items()
        }

    save_file(cast(encoder.model.state_dict()), str(path / "encoder.safetensors"))
    save_file(cast(projector.state_dict()), str(path / "projector.safetensors"))
    stored = ConnectorConfig(
        **{
            **asdict(config),
            "encoder": EncoderSpec(
                config.encoder.name, config.encoder.kwargs, None, config.encoder.data
            ),
        }
    )
    stored.save(path)
