"""Audio deadline scheduling on a simulated clock: the engine's real scheduler and steps
(a tiny random Llama on the CPU), with time advanced by a step-cost model instead of the
wall clock, so the outcome is the same on any machine.

The load is more voice than the simulated machine can play in real time: 24 streams
arrive 20 ms apart, each 2 s of audio (50 frames of 2 tokens, 40 ms a frame), and a step
costs 4 ms + 1 ms a row, so at most 16 streams can run every step and keep up. The
client model here (written apart from the engine's own clock) plays each stream from its
first chunk plus a 200 ms buffer and counts every silence while it waits for a chunk.
FIFO admits all 24 and every one of them falls behind; deadline scheduling plays the
streams it admits without a gap and refuses the others once their first-audio target
has passed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mmserve.config import EngineConfig
from mmserve.engine.engine import LLMEngine
from mmserve.engine.playback import AudioSpec
from mmserve.engine.warmup import warm_up
from mmserve.sampling_params import SamplingParams

FRAME_S, TPF, FRAMES, BUFFER_S = 0.04, 2, 50, 0.2
STREAMS, ARRIVAL_GAP_S = 24, 0.02
# A load here takes a few hundred engine steps (warm-up included) and ends within a few
# simulated seconds; these bounds are far beyond that, so only a stalled load meets them.
MAX_SIM_S, MAX_STEPS, MAX_FROZEN_STEPS = 60.0, 5_000, 500


class SimClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class StallGuard:
    """Fails a simulated load that stops making progress, instead of looping forever.

    The loop runs until every stream ends, so a policy bug that keeps streams waiting
    would hang the test: the engine may step without running anything while asking to
    step again at once (the simulated clock then never moves), or time may pass with
    streams never finishing. Either ends in an AssertionError that names the stall."""

    def __init__(self, clock: SimClock) -> None:
        self.clock, self.t0 = clock, clock.t
        self.steps = self.frozen = 0
        self._last_t = clock.t

    def check(self, engine: LLMEngine) -> None:
        """Called once per loop iteration, after the clock has been advanced."""
        t = self.clock.t
        self.steps += 1
        self.frozen = self.frozen + 1 if t == self._last_t else 0
        self._last_t = t
        stall = None
        if self.frozen > MAX_FROZEN_STEPS:
            stall = f"the simulated clock stopped: {self.frozen} steps in a row left it still"
        elif self.steps > MAX_STEPS:
            stall = f"{self.steps} steps without the load ending"
        elif t - self.t0 > MAX_SIM_S:
            stall = f"{t - self.t0:.1f} simulated seconds without the load ending"
        if stall is not None:
            sched = engine.scheduler
            raise AssertionError(
                f"load stalled at t={t - self.t0:.3f}s: {stall} (running "
                f"{len(sched.running)}, waiting {len(sched.waiting)}, admitted streams "
                f"{sorted(sched.policy.admitted)}, idle_for {engine.idle_for():.6f}s)"
            )


def step_cost(seqs) -> float:
    """The simulated machine: 4 ms a step, 1 ms a row, 20 us a prefill token."""
    prefill = sum(s.num_tokens for s in seqs if s.num_tokens > 1)
    return 0.004 + 0.001 * len(seqs) + 0.00002 * prefill


def tiny_model():
    from mmserve.models.registry import build_model

    h, inter, vocab = 64, 128, 512
    cfg = dict(
        model_type="llama",
        hidden_size=h,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=inter,
        vocab_size=vocab,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
    )
    g = torch.Generator().manual_seed(0)
    p = "model.layers.0"
    shapes = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
        f"{p}.self_attn.q_proj.weight": (h, h),
        f"{p}.self_attn.k_proj.weight": (32, h),
        f"{p}.self_attn.v_proj.weight": (32, h),
        f"{p}.self_attn.o_proj.weight": (h, h),
        f"{p}.mlp.gate_proj.weight": (inter, h),
        f"{p}.mlp.up_proj.weight": (inter, h),
        f"{p}.mlp.down_proj.weight": (h, inter),
        f"{p}.input_layernorm.weight": (h,),
        f"{p}.post_attention_layernorm.weight": (h,),
    }
    sd = {
        k: torch.randn(s, generator=g) * (1.0 if len(s) == 1 else s[-1] ** -0.5)
        for k, s in shapes.items()
    }
    return build_model(cfg, sd, torch.float32, "cpu")


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from mmserve.models.tokenizer import Tokenizer

    return Tokenizer(default_model_dir)


def simulate(
    mode: str,
    tokenizer,
    streams: int = STREAMS,
    texts: tuple[tuple[float, int, int], ...] = (),
    warm_up_step_s: float = 0.0,
) -> tuple[dict[str, list], dict[str, str], LLMEngine]:
    """Run the load (``streams`` audio streams; text requests ``(arrival, prompt tokens,
    new tokens)`` named t0, t1, ...) -> ({request: [(time, tokens)] chunks}, {request:
    finish reason}, engine). ``warm_up_step_s`` > 0: the engine is warmed up first (as
    ``create_engine`` does on CUDA), every warm-up step paying that long for its
    compiles."""
    config = EngineConfig(
        device="cpu",
        max_num_seqs=64,
        num_kv_blocks=512,
        enable_prefix_caching=False,
        async_scheduling=False,
        audio_scheduling=mode,
        audio_lead_s=0.6,
        audio_queue_s=1.0,
    )
    engine = LLMEngine(config, tiny_model(), tokenizer, 512, torch.device("cpu"), torch.float32)
    clock = SimClock()
    engine.scheduler.policy.clock = clock
    run = engine.runner.run

    compiling = [warm_up_step_s > 0]

    def timed_run(seqs, *args, **kwargs):
        out = run(seqs, *args, **kwargs)
        clock.t += warm_up_step_s if compiling[0] else step_cost(seqs)
        return out

    engine.runner.run = timed_run
    if compiling[0]:
        warm_up(engine)
        compiling[0] = False
        clock.t += 1.0
    t0 = clock.t  # the load starts now
    guard = StallGuard(clock)
    params = SamplingParams(temperature=0, max_tokens=FRAMES * TPF, ignore_eos=True)
    spec = AudioSpec(
        "s",
        FRAME_S,
        TPF,
        buffer_s=BUFFER_S,
        first_audio_s=0.25,
        first_chunk_frames=1,
        max_chunk_frames=8,
    )
    arrivals = sorted(
        [(t0 + i * ARRIVAL_GAP_S, f"s{i}") for i in range(streams)]
        + [(t0 + t, f"t{i}") for i, (t, _, _) in enumerate(texts)]
    )
    chunks: dict[str, list] = {sid: [] for _, sid in arrivals}
    reasons: dict[str, str] = {}
    while arrivals or engine.has_unfinished():
        while arrivals and arrivals[0][0] <= clock.t:
            _, sid = arrivals.pop(0)
            if sid.startswith("t"):
                _, n, new_tokens = texts[int(sid[1:])]
                engine.add_request(
                    [(11 * j) % 500 + 3 for j in range(n)],
                    SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True),
                    sid,
                )
                continue
            prompt = [(7 * int(sid[1:]) + j) % 500 + 3 for j in range(16)]
            engine.add_request(prompt, params, sid, audio=dataclasses.replace(spec, stream_id=sid))
        for out in engine.step():
            if out.new_token_ids:
                chunks[out.request_id].append((clock.t, len(out.new_token_ids)))
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        if not engine.has_unfinished() or engine.idle_for() > 0:
            nxt = clock.t + (engine.idle_for() if engine.has_unfinished() else 1.0)
            clock.t = min(nxt, arrivals[0][0]) if arrivals else nxt
        guard.check(engine)
    return chunks, reasons, engine


def client_gaps(chunks: list[tuple[float, int]]) -> tuple[float, float]:
    """The client's (time of first audio, total silence after playback began)."""
    first = chunks[0][0]
    cursor, silence = first + BUFFER_S, 0.0
    for t, tokens in chunks:
        if t > cursor + 1e-9:
            silence += t - cursor
            cursor = t
        cursor += -(-tokens // TPF) * FRAME_S
    return first, silence


def test_deadline_scheduling_plays_what_it_admits_where_fifo_underruns(tokenizer):
    fifo_chunks, fifo_reasons, fifo = simulate("fifo", tokenizer)
    chunks, reasons, deadline = simulate("deadline", tokenizer)
    for eng in (fifo, deadline):
        assert eng.blocks.num_used_blocks == 0 and not eng.scheduler.policy.streams

    # FIFO: every stream admitted and played to the end, nearly all with gaps
    assert set(fifo_reasons.values()) == {"length"}
    fifo_silence = [client_gaps(c)[1] for c in fifo_chunks.values()]
    assert sum(s > 0 for s in fifo_silence) >= STREAMS * 3 // 4
    assert max(fifo_silence) > 0.2

    # deadline: the admitted streams play without a gap; the rest are refused, not starved
    served = [sid for sid, r in reasons.items() if r == "length"]
    refused = [sid for sid, r in reasons.items() if r == "overloaded"]
    assert len(served) + len(refused) == STREAMS
    assert len(served) >= 10 and refused
    for sid in served:
        first, silence = client_gaps(chunks[sid])
        assert silence == 0.0, (sid, silence)
        assert sum(n for _, n in chunks[sid]) == FRAMES * TPF
    assert all(not chunks[sid] for sid in refused)
    assert deadline.stats().audio_streams_refused_total == len(refused)
    # first chunks are small and later ones larger
    assert max(chunks[served[0]][0][1], 0) <= 2 * TPF
    assert max(n for _, n in chunks[served[0]]) >= 4 * TPF


def test_text_is_not_held_behind_a_stream_waiting_for_room(tokenizer):
    """Fourteen streams, one more than the simulated machine plays in real time: the last
    waits for room. Text requests arriving meanwhile start at once (in the time the
    playing streams leave), not when the waiting stream is admitted or refused; every
    stream that plays, plays without a gap."""
    texts = ((0.3, 480, 8), (0.38, 40, 8))
    chunks, reasons, engine = simulate("deadline", tokenizer, streams=14, texts=texts)
    assert engine.blocks.num_used_blocks == 0
    waiting = "s13"
    assert not chunks[waiting] or chunks[waiting][0][0] > 1.0  # room came late, or never
    for i, (arrival, _, new_tokens) in enumerate(texts):
        got = chunks[f"t{i}"]
        assert reasons[f"t{i}"] == "length" and sum(n for _, n in got) == new_tokens
        assert got[0][0] - arrival < 0.3, (i, got[0][0] - arrival)
    for sid in (s for s in chunks if s.startswith("s")):
        assert not chunks[sid] or client_gaps(chunks[sid])[1] == 0.0, sid


def test_warm_up_steps_do_not_price_admission(tokenizer):
    """Warm-up steps pay one-off compiles (seconds on CUDA); they are no measure of what a
    step costs once serving. The warm-up's steps of 16 and 17 rows were the only ones
    with many rows, so a step-cost fit that kept them priced every added row at their
    compile time and refused nearly every stream that the machine can play."""
    _, cold_reasons, _ = simulate("deadline", tokenizer)
    chunks, reasons, engine = simulate("deadline", tokenizer, warm_up_step_s=0.3)
    served = [sid for sid, r in reasons.items() if r == "length"]
    cold_served = [sid for sid, r in cold_reasons.items() if r == "length"]
    assert len(served) >= len(cold_served) >= 10
    for sid in served:
        assert client_gaps(chunks[sid])[1] == 0.0, sid
    assert engine.blocks.num_used_blocks == 0
