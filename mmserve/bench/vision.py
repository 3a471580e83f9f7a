"""``mmserve bench vision``: captioning throughput against HF transformers, same run.

Both sides caption the same generated images (the generator's "test" split) with the
same connector (its encoder + projector modules) and the same LM weights, greedy:

- mmserve: the in-process engine with the connector as its span encoder, ``c`` requests
  in flight (``connectors.caption_job.caption_all``'s loop, captions kept in memory).
- HF: ``LlamaForCausalLM.generate(inputs_embeds=...)`` on batches of ``c`` images:
  the connector encodes the batch, its rows are spliced into the prompt's token
  embeddings, rows are left-padded.

Each concurrency level begins with an untimed pass of its own batch size on each side,
then each of its ``repeats`` timed passes gets its own images
(no encoder-cache or prefix-cache reuse of images between passes; the text before the
image is shared within a level, as any server's prefix cache would share it). Reported
per level, from the median pass: images/s, generated tok/s, the ratio to HF; and how
many captions of all passes are identical. JSON + PNG (drawn with PIL).
"""

from __future__ import annotations

import asyncio
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from connectors import synthetic
from connectors.prompt import ImageChatPrompt


def _images(level: int, n: int) -> list:
    return [synthetic.sample("test", 10_000 + level * n + i)[0] for i in range(n)]


def _warm_images(c: int) -> list:
    """``c`` images for a level's untimed pass (seeds no timed pass draws)."""
    return [synthetic.sample("test", 1_000_000 + 1_000 * c + i)[0] for i in range(c)]


async def _mmserve_level(
    engine: Any, images: list, c: int, text: str, params: Any
) -> tuple[list[str], int]:
    turn = ImageChatPrompt(engine.tokenizer, engine.image_processor, text)
    prompts = turn.each(images)
    captions: list[str] = [""] * len(images)
    tokens = 0
    queue = list(range(len(images)))

    async def worker() -> None:
        nonlocal tokens
        while queue:
            i = queue.pop(0)
            async for o in engine.generate(prompts[i].ids, params, spans=prompts[i].spans):
                captions[i] = o.text
                tokens += len(o.new_token_ids)

    await asyncio.gather(*(worker() for _ in range(c)))
    return captions, tokens


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _level(passes: list[tuple[float, list[str], int]], n_images: int) -> dict:
    """A level's figures from its timed passes ((seconds, captions, tokens) each, every
    pass its own images: a repeated image would hit the encoder and prefix caches): the
    median pass's rates (a level of 128 images at 32 is a quarter of a second on a GPU,
    where one stray pause moves a pass by tens of percent) and every pass's captions."""
    ranked = sorted(passes, key=lambda p: p[0])
    seconds, _, toks = ranked[(len(ranked) - 1) // 2]
    return {
        "seconds": seconds,
        "pass_seconds": [p[0] for p in passes],
        "images_s": n_images / seconds,
        "gen_tok_s": toks / seconds,
        "captions": [c for p in passes for c in p[1]],
    }


def run_mmserve(
    engine: Any, levels: list[tuple[int, list[list]]], text: str, max_tokens: int
) -> dict:
    """``levels``: (concurrency, [one pass's images, ...]) each."""
    from mmserve import SamplingParams
    from mmserve.bench.serve import counters_delta, engine_counters

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    asyncio.run(_mmserve_level(engine, _images(99, 2), 2, text, params))  # warm-up
    out = {}
    for c, sets in levels:
        # one untimed batch at this concurrency first, on both sides: a batch size's
        # first run pays its own start-up (HF's first pass of 32 took 1.7x its later ones)
        asyncio.run(_mmserve_level(engine, _warm_images(c), c, text, params))
        passes = []
        before = engine_counters(engine.engine)
        for images in sets:
            t0 = time.perf_counter()
            caps, toks = asyncio.run(_mmserve_level(engine, images, c, text, params))
            passes.append((time.perf_counter() - t0, caps, toks))
        out[str(c)] = _level(passes, len(sets[0]))
        # what the step loop did over the level's timed passes (steps, mean batch, share
        # launched ahead, requests admitted ahead)
        out[str(c)]["counters"] = counters_delta(before, engine_counters(engine.engine))
    return out


class HFCaptioner:
    """HF transformers' LM + the same connector modules, batched ``generate``."""

    def __init__(
        self,
        lm_path: Path,
        connector: Any,
        tokenizer: Any,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        from transformers import AutoModelForCausalLM

        lm: Any = AutoModelForCausalLM.from_pretrained(str(lm_path), dtype=dtype)
        self.lm: Any = lm.to(device).eval()
        self.connector, self.tokenizer, self.device = connector, tokenizer, device
        self.eos = sorted(tokenizer.eos_token_ids)

    @torch.inference_mode()
    def caption(self, images: list, text: str, max_tokens: int) -> tuple[list[str], int]:
        turn = ImageChatPrompt(self.tokenizer, self.connector.processor, text)
        prompts = turn.each(images)
        rows = self.connector.encode([p.spans[0].payload for p in prompts])
        embed = self.lm.get_input_embeddings()
        width = max(len(p.ids) for p in prompts)
        x = torch.zeros(
            len(prompts), width, embed.embedding_dim, device=self.device, dtype=embed.weight.dtype
        )
        mask = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for b, (p, r) in enumerate(zip(prompts, rows, strict=True)):
            e = embed(torch.tensor(p.ids, device=self.device))
            for sp in p.spans:
                e[sp.start : sp.end] = r[sp.offset : sp.offset + sp.length].to(e.dtype)
            x[b, width - len(p.ids) :] = e  # left padding
            mask[b, width - len(p.ids) :] = 1
        out = self.lm.generate(
            inputs_embeds=x,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=self.eos,
            pad_token_id=self.eos[0],
        )
        caps, tokens = [], 0
        for seq in out.tolist():
            ids = []
            for t in seq:
                if t in self.eos:
                    break
                ids.append(t)
            tokens += len(ids) + (len(ids) < len(seq))  # the EOS is a generated token too
            caps.append(self.tokenizer.decode(ids))
        return caps, tokens


def run_hf(
    hf: HFCaptioner, levels: list[tuple[int, list[list]]], text: str, max_tokens: int
) -> dict:
    hf.caption(_images(99, 2), text, max_tokens)  # warm-up
    out = {}
    for c, sets in levels:
        hf.caption(_warm_images(c), text, max_tokens)  # untimed, as ``run_mmserve``'s
        passes = []
        for images in sets:
            _sync(hf.device)
            t0 = time.perf_counter()
            caps: list[str] = []
            toks = 0
            for i in range(0, len(images), c):
                cs, ts = hf.caption(images[i : i + c], text, max_tokens)
                caps, toks = caps + cs, toks + ts
            _sync(hf.device)
            passes.append((time.perf_counter() - t0, caps, toks))
        out[str(c)] = _level(passes, len(sets[0]))
    return out


def run_vision_bench(
    connector: str = "auto",
    lm: str | None = None,
    device: str = "auto",
    images: int = 64,
    concurrency: tuple[int, ...] = (1, 8, 32),
    max_tokens: int = 24,
    out_dir: str = "bench/out",
    hf: bool = True,
    dtype: str = "auto",
    repeats: int = 1,
) -> dict:
    """Each side captions ``repeats`` passes of ``images`` images a level, each pass its
    own images; the median pass counts."""
    from mmserve.config import EngineConfig
    from mmserve.engine.async_engine import AsyncEngine
    from mmserve.models.hub import resolve_model

    engine = AsyncEngine.from_config(
        EngineConfig(
            model=lm,
            device=device,
            dtype=dtype,
            connector=connector,
            max_num_seqs=max(max(concurrency), 1),
            max_model_len=512,
            preload_grammar=False,
        )
    )  # nothing constrained: no compiler built beside the timed loop
    try:
        conn = engine.engine.connector
        if conn is None:
            raise ValueError("no vision connector is served; pass --connector DIR")
        text = getattr(conn.config, "prompt", "Describe the image.")
        # pass r of level k: its own images (with one pass, level k's as before)
        levels = [
            (c, [_images(k + len(concurrency) * r, images) for r in range(repeats)])
            for k, c in enumerate(concurrency)
        ]
        result: dict[str, Any] = {
            "machine": _machine(engine.engine.device),
            "lm": engine.model_name,
            "connector": str(connector),
            "dtype": str(engine.engine.dtype),
            "images": images,
            "max_tokens": max_tokens,
            "instruction": text,
            "repeats": repeats,
            "mmserve": run_mmserve(engine, levels, text, max_tokens),
        }
        if hf:
            ref = HFCaptioner(
                resolve_model(lm), conn, engine.tokenizer, engine.engine.device, engine.engine.dtype
            )
            result["hf"] = run_hf(ref, levels, text, max_tokens)
            result["compare"] = _compare(result["mmserve"], result["hf"])
    finally:
        engine.shutdown_sync()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vision.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "vision.png")
    print(table(result))
    return result


def _compare(ours: dict, ref: dict) -> dict:
    out = {}
    for c in ours:
        a, b = ours[c]["captions"], ref[c]["captions"]
        out[c] = {
            "speedup_images": ours[c]["images_s"] / ref[c]["images_s"],
            "speedup_tok": ours[c]["gen_tok_s"] / max(ref[c]["gen_tok_s"], 1e-9),
            "identical_captions": sum(x == y for x, y in zip(a, b, strict=True)),
            "of": len(a),
        }
    return out


def _machine(device: torch.device) -> dict:
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    return {
        "device": str(device),
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def table(result: dict) -> str:
    lines = [
        f"vision captioning: {result['lm']} + {result['connector']} on "
        f"{result['machine']['gpu'] or result['machine']['device']}, {result['images']} "
        f"images a level, <= {result['max_tokens']} new tokens, greedy",
        "conc  mmserve img/s  tok/s    HF img/s  tok/s    speedup  identical",
    ]
    for c, m in result["mmserve"].items():
        h = result.get("hf", {}).get(c)
        cmp = result.get("compare", {}).get(c)
        hf_cells = f"{h['images_s']:8.2f}  {h['gen_tok_s']:7.1f}" if h else "       -        -"
        extra = (
            f"{cmp['speedup_images']:6.2f}x  {cmp['identical_captions']}/{cmp['of']}" if cmp else ""
        )
        lines.append(f"{c:>4}  {m['images_s']:13.2f}  {m['gen_tok_s']:7.1f}  {hf_cells}   {extra}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Images/s against concurrency for both sides, as a bar chart drawn with PIL."""
    from PIL import Image, ImageDraw

    levels = list(result["mmserve"])
    series = [("mmserve", result["mmserve"], (40, 90, 200))]
    if "hf" in result:
        series.append(("HF transformers", result["hf"], (220, 120, 40)))
    top = max(v["images_s"] for _, s, _ in series for v in s.values()) * 1.15
    w, h, left, base = 120 + 150 * len(levels), 360, 70, 300
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    d.text(
        (left, 10),
        "images/s by concurrency (" + (result["machine"]["gpu"] or "cpu") + ")",
        fill="black",
    )
    d.line((left, 40, left, base), fill="black")
    d.line((left, base, w - 20, base), fill="black")
    for k in range(5):
        y = base - (base - 40) * k / 4
        d.text((5, y - 6), f"{top * k / 4:7.1f}", fill="black")
    bar = 50
    for i, c in enumerate(levels):
        x0 = left + 30 + i * 150
        for j, (_, s, colour) in enumerate(series):
            v = s[c]["images_s"]
            y = base - (base - 40) * v / top
            d.rectangle((x0 + j * bar, y, x0 + (j + 1) * bar - 6, base), fill=colour)
            d.text((x0 + j * bar, y - 14), f"{v:.1f}", fill="black")
        d.text((x0 + 20, base + 8), f"c={c}", fill="black")
    for j, (name, _, colour) in enumerate(series):
        d.rectangle((left + j * 170, 330, left + j * 170 + 12, 342), fill=colour)
        d.text((left + j * 170 + 18, 330), name, fill="black")
    img.save(path)
