"""mmserve's model path, timed: paged KV, block tables, Triton kernels, CUDA-graph decode.

This is the engine's forward (``LLMEngine`` -> ``ModelRunner`` -> model) without the
scheduler, sampler and detokenizer around it: prefill is one eager forward over
the batch's prompts; decode is :class:`~mmserve.engine.cuda_graphs.DecodeGraphs`
(or the same forward, eager), greedy, with the sampled ids brought to the host
every step as the engine must (for stop checks and streaming), the argmax taken inside
the graph as the engine's greedy steps take it. The KV cache is a plain
tensor in the model's dtype, or (``kv_dtype=FP8_DTYPE``) the engine's fp8 ``KVCache``
with per-token scales, as ``--kv-cache-dtype fp8_e4m3`` gives the engine.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from mmserve.bench.limits import copy_bandwidth
from mmserve.engine.cuda_graphs import DecodeGraphs
from mmserve.engine.kv_cache import KVCache
from mmserve.kernels.attention import KVLike
from mmserve.kernels.fp8 import is_fp8
from mmserve.kernels.triton_attention import PagedMetadata
from mmserve.kernels.triton_copy import copy_flat
from mmserve.models.base import CausalLM

BLOCK_SIZE = 16


def tuning_overrides(text: str, extra: Iterable[str] = (), name: str = "") -> dict:
    """A command line's JSON object of ``settings.StackTuning`` changes (keys in ``extra``
    allowed too; lists become tuples, as the frozen fields hold them); an unknown key
    stops the script, named."""
    from dataclasses import fields

    from mmserve.kernels.settings import StackTuning

    over = json.loads(text)
    unknown = set(over) - {f.name for f in fields(StackTuning)} - set(extra)
    if unknown:
        raise SystemExit(f"{name + ': ' if name else ''}not StackTuning fields: {sorted(unknown)}")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in over.items()}


@dataclass
class DecodeResult:
    batch: int
    steps: int
    seconds: float
    step_ms_p50: float
    step_ms_p99: float
    row0: list[int]  # row 0's tokens: compared across batch sizes (batch invariance)

    @property
    def tok_s(self) -> float:
        return self.batch * self.steps / self.seconds


def make_kv(model: CausalLM, blocks: int, dtype: torch.dtype) -> KVLike:
    """``blocks`` blocks of KV for ``model``: a plain (L, 2, blocks, BLOCK_SIZE, Hkv, D) tensor
    in the model's dtype, or an fp8 ``KVCache`` (e4m3 values + float32 scales)."""
    p = next(model.parameters())
    layers, heads, dim = model.num_layers, model.num_kv_heads, model.head_dim
    if is_fp8(dtype):
        return KVCache(layers, blocks, BLOCK_SIZE, heads, dim, dtype=dtype, device=p.device)
    if dtype != p.dtype:
        raise ValueError(f"KV dtype {dtype}: use the model's ({p.dtype}) or fp8 (e4m3fn)")
    return torch.zeros(layers, 2, blocks, BLOCK_SIZE, heads, dim, dtype=dtype, device=p.device)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters, a tied tensor counted once."""
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())


def random_cuda_model(name: str, q8_head: bool = False) -> tuple[CausalLM, dict]:
    """The named benchmark shape (``bench.shapes``) with HF's random init, as the engine's
    bf16 model on CUDA -> (model, its config). ``q8_head``: its LM head's weight rounded to
    Q8_0 blocks first (``q8_head_weights``)."""
    from mmserve.bench.hf_run import build_hf_model
    from mmserve.bench.shapes import shape
    from mmserve.models.registry import build_model

    cfg = shape(name)
    hf = build_hf_model(cfg)
    sd = q8_head_weights(hf) if q8_head else hf.state_dict()
    model = build_model(cfg, sd, torch.bfloat16, "cuda")
    if q8_head and model.q8_head() is None:
        raise RuntimeError("the LM head's Q8_0 blocks were not attached")
    return model, cfg


def q8_head_weights(hf) -> dict[str, torch.Tensor]:
    """The HF model's state dict with its LM head's weight (a tied model's embedding) rounded
    to Q8_0 blocks, as both shipped GGUFs store theirs: in float32 (exact, so ``build_model``
    finds the blocks and the engine's head reads them), and written into ``hf`` in its
    dtype, so the HF baselines run the same weights."""
    from mmserve.kernels.q8 import quantize_q8

    sd = hf.state_dict()
    head = hf.get_output_embeddings().weight
    key = "model.embed_tokens.weight" if hf.config.tie_word_embeddings else "lm_head.weight"
    w = quantize_q8(sd[key]).dequantize(torch.float32)
    with torch.no_grad():
        head.copy_(w)
    return {**sd, key: w}


def kv_nbytes(kv: KVLike) -> int:
    """Bytes the cache holds (an fp8 cache's scales included)."""
    if isinstance(kv, torch.Tensor):
        return kv.numel() * kv.element_size()
    assert isinstance(kv, KVCache)
    return kv.nbytes


def _decoded(batch: int, times: list[float], row0: list[int]) -> DecodeResult:
    """A decode's result from its timed steps' seconds (median and p99 in ms)."""
    ms = sorted(t * 1e3 for t in times)
    return DecodeResult(
        batch,
        len(times),
        sum(times),
        statistics.median(ms),
        ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        row0,
    )


class PagedDecoder:
    """Fixed block tables: sequence ``i`` owns blocks ``1 + i * per_seq ..`` (block 0 spare).

    ``kv_dtype`` (default: the model's dtype) picks the cache: the model's dtype gives a
    plain tensor, ``FP8_DTYPE`` an fp8 ``KVCache`` with the same number of blocks.
    """

    def __init__(
        self, model: CausalLM, max_batch: int, max_len: int, kv_dtype: torch.dtype | None = None
    ) -> None:
        p = next(model.parameters())
        self.model, self.device = model, p.device
        self.per_seq = -(-max_len // BLOCK_SIZE)
        self.kv_dtype = p.dtype if kv_dtype is None else kv_dtype
        self.kv = make_kv(model, 1 + max_batch * self.per_seq, self.kv_dtype)
        self.kv_bytes = kv_nbytes(self.kv)
        self.tables = 1 + np.arange(max_batch * self.per_seq).reshape(max_batch, self.per_seq)
        self.graphs = DecodeGraphs(model, self.kv, self.per_seq, (1,))  # eager until capture

    def capture(self, sizes: tuple[int, ...]) -> dict:
        self.graphs = DecodeGraphs(self.model, self.kv, self.per_seq, (1,))  # drop old graphs
        gc.collect()
        torch.cuda.empty_cache()
        self.graphs = DecodeGraphs(self.model, self.kv, self.per_seq, sizes)
        rep = self.graphs.capture()
        return {
            "batch_sizes": rep.batch_sizes,
            "seconds": rep.seconds,
            "memory_mib": rep.pool_bytes / 2**20,
        }

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> list[int]:
        """One forward over every prompt (positions from 0) -> greedy first tokens."""
        b, dev = len(prompts), self.device
        lens = [len(p) for p in prompts]
        starts = np.cumsum([0] + lens[:-1])
        slots = np.concatenate(
            [
                self.tables[i, np.arange(n) // BLOCK_SIZE] * BLOCK_SIZE + np.arange(n) % BLOCK_SIZE
                for i, n in enumerate(lens)
            ]
        )
        meta = PagedMetadata(
            torch.as_tensor(slots).to(dev),
            torch.as_tensor(self.tables[:b]).to(dev),
            torch.tensor(lens, device=dev),
            torch.as_tensor(starts).to(dev),
            torch.tensor(lens, device=dev),
            max(lens),
        )
        ids = torch.tensor([t for p in prompts for t in p], device=dev)
        pos = torch.cat([torch.arange(n, device=dev) for n in lens])
        hidden = self.model(ids, pos, meta, self.kv)
        last = torch.as_tensor(starts + np.array(lens) - 1).to(dev)
        return self.model.compute_logits(hidden[last]).argmax(-1).tolist()

    @torch.inference_mode()
    def decode(
        self,
        first: list[int],
        start_pos: int,
        steps: int,
        graphs: bool,
        warmup: int = 3,
        ahead: bool = False,
    ) -> DecodeResult:
        """``steps`` greedy decode steps for every row, after ``warmup`` untimed ones.
        ``ahead``: as the engine's async scheduling runs a plain greedy decode on CUDA
        (``LLMEngine.step``), each graph step is launched from the last one's argmax on
        the device before the host waits for that step's tokens (the same tokens)."""
        assert self.graphs.graphs or not graphs, "capture() first"
        if ahead and graphs and self.graphs.fits(len(first)):
            return self._decode_ahead(first, start_pos, steps, warmup)
        ids, b = list(first), len(first)
        pos = [start_pos] * b
        times, row0 = [], []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            # the host needs the ids (stop checks, streams); a graph takes the argmax itself
            if graphs and self.graphs.fits(b):
                ids = self.graphs.run_verify(
                    [[t] for t in ids], pos, self.tables[:b], BLOCK_SIZE
                ).argmax.tolist()
            else:  # no graph holds the batch (or eager asked for): the same kernels
                ids = (
                    self.graphs.run_eager(ids, pos, self.tables[:b], BLOCK_SIZE).argmax(-1).tolist()
                )
            pos = [p + 1 for p in pos]
            row0.append(ids[0])
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return _decoded(b, times, row0)

    def _decode_ahead(
        self, first: list[int], start_pos: int, steps: int, warmup: int
    ) -> DecodeResult:
        """``decode`` with each step launched before the host reads the last one's tokens:
        its argmax, read in place (the next replay rewrites it only after the reads
        queued before it), is the next step's input ids, and the launch that copies them
        in also writes them into pinned memory, behind an event; then the host waits for
        the event (the engine's ``LaunchAhead``). A step's time is
        from one step's tokens on the host to the next's."""
        b = len(first)
        host = torch.empty(b, dtype=torch.long, pin_memory=True)
        ready = torch.cuda.Event()
        tables, pos = self.tables[:b], [start_pos] * b
        step = self.graphs.run_verify([[t] for t in first], pos, tables, BLOCK_SIZE)
        times, row0 = [], []
        t0 = time.perf_counter()
        for i in range(warmup + steps):
            picked = step.argmax[:b]
            pos = [p + 1 for p in pos]
            if i + 1 < warmup + steps:
                step = self.graphs.run_verify(
                    [[0]] * b, pos, tables, BLOCK_SIZE, input_ids=picked, tokens_to=(host, ready)
                )
            else:  # no step after it: its own copy
                copy_flat(host, picked)
                ready.record()
            ready.synchronize()
            row0.append(int(host[0]))
            t1 = time.perf_counter()
            if i >= warmup:
                times.append(t1 - t0)
            t0 = t1
        return _decoded(b, times, row0)

    def recaptured_step_ms(self, first: list[int], steps: int = 100) -> tuple[float, list[int]]:
        """Batch-1 graphs captured anew (kernel options set since are taken), then ``steps``
        decode steps from ``first`` at position 128, each launched before the host reads
        the last (``decode``'s ``ahead``: the GPU's step time, the host's overlapped) ->
        (mean step ms, row-0 tokens). Launched ahead, two runs of the same settings
        agree far more closely than synchronous medians do (docs/performance.md)."""
        self.capture((1,))
        r = self.decode(first, 128, steps, graphs=True, ahead=True)
        return r.seconds / r.steps * 1e3, r.row0

    def ttft(self, prompt_len: int, vocab: int, repeats: int = 3) -> dict:
        """Time to first token of one ``prompt_len`` prompt (prefill + logits + host id)."""
        prompt = torch.randint(0, vocab, (prompt_len,)).tolist()
        self.prefill([prompt])  # warm-up (compiles the prefill shapes)
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.prefill([prompt])
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        return {
            "prompt_len": prompt_len,
            "ttft_ms": s * 1e3,
            "prefill_tok_s": prompt_len / s,
            "ttft_ms_all": [t * 1e3 for t in times],
        }


def prompted_decoder(
    name: str, max_len: int = 512, q8_head: bool = False
) -> tuple[PagedDecoder, list[int], dict]:
    """A model shape (random bf16 weights; ``q8_head``: the LM head's as Q8_0 blocks) at
    batch 1 after a fixed 128-token prompt -> (decoder, first tokens, the shape's config)."""
    model, cfg = random_cuda_model(name, q8_head)
    dec = PagedDecoder(model, 1, max_len)
    first = dec.prefill(
        [
            torch.randint(
                0, cfg["vocab_size"], (128,), generator=torch.Generator().manual_seed(0)
            ).tolist()
        ]
    )
    return dec, first, cfg


def batch1_step_baseline(name: str) -> tuple[PagedDecoder, list[int], dict]:
    """A model shape (random bf16 weights) at batch 1 after a 128-token prompt, for the
    launch-option sweeps: -> (decoder, first tokens, report with the copy roofline and the
    default step's median ms and row-0 tokens, printed)."""
    bw = max(copy_bandwidth()["gb_s"]) * 1e9
    dec, first, cfg = prompted_decoder(name)
    roof_ms = weight_bytes(dec.model) / bw * 1e3
    base_ms, row0 = dec.recaptured_step_ms(first)
    print(
        f"[{name}] copy roofline {roof_ms * 1e3:.0f} us a step; default {base_ms * 1e3:.0f} us"
        f" ({roof_ms / base_ms * 100:.1f} %)",
        flush=True,
    )
    return (
        dec,
        first,
        {
            "shape": name,
            "hidden": cfg["hidden_size"],
            "copy_gb_s": bw / 1e9,
            "roofline_ms": roof_ms,
            "default_ms": base_ms,
            "default_row0": row0,
        },
    )
