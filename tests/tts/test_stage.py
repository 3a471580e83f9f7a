"""The audio stage groups frames into chunks (``tts.chunking``) without changing a sample:
streamed through the stage, in any grouping and with streams in and out of step, the
default voice's audio equals the codec's non-streaming decode; the first chunk is one
frame, later ones grow to the cap; a client that would run dry gets its frames early."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from tts.chunking import played_until
from tts.registry import load
from tts.stage import AudioRequest, AudioStage


@dataclass
class Out:
    """What the stage reads and writes of an engine ``RequestOutput``."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    audio: np.ndarray | None = None


@pytest.fixture(scope="module")
def voice():
    v = load(None)
    return v, v.load_codec(torch.device("cpu")).to(torch.float32).eval()


class Clock:
    def __init__(self, step_s: float = 0.0) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def run(stage: AudioStage, tokens: dict[str, list[int]], starts: dict[str, int], paced=False):
    """One token a step a stream, as the engine decodes; a stream's last token finishes
    it. -> each stream's chunks (PCM of every step that gave it audio)."""
    chunks: dict[str, list[np.ndarray]] = {r: [] for r in tokens}
    end = max(starts[r] + len(t) for r, t in tokens.items())
    for step in range(end):
        outs = []
        for r, toks in tokens.items():
            i = step - starts[r]
            if i == 0:
                stage.open(r, AudioRequest(seed=0, paced=paced))
            if 0 <= i < len(toks):
                outs.append(Out(r, [toks[i]], finished=i == len(toks) - 1))
        stage.process(outs)
        for o in outs:
            if o.audio is not None and len(o.audio):
                chunks[o.request_id].append(o.audio)
    assert not stage.streams, "every stream finished"
    return chunks


def speak(v, codec, frames: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    codes = torch.randint(
        0, codec.codebook_size, (1, frames, 1), generator=torch.Generator().manual_seed(seed)
    )
    return codes, v.layout.frame_tokens(codes[0].tolist())


def count_calls(stage: AudioStage) -> list[tuple[int, int]]:
    """(rows, frames) of every codec call the stage makes."""
    calls: list[tuple[int, int]] = []
    step = stage.slots.step

    def counted(slots, codes):
        calls.append((len(slots), codes.shape[1]))
        return step(slots, codes)

    stage.slots.step = counted  # type: ignore[method-assign]
    return calls


def test_grouped_chunks_equal_the_whole_decode(voice):
    v, codec = voice
    stage = AudioStage(codec, v.layout, 4, max_chunk_s=0.32, clock=Clock())  # time stands still
    calls = count_calls(stage)
    codes, tokens = speak(v, codec, 60, 0)
    chunks = run(stage, {"a": tokens}, {"a": 0})["a"]
    whole = codec.decode(codes)[0].numpy()
    assert np.abs(np.concatenate(chunks) - whole).max() <= codec.tolerance
    # the first chunk is one frame; later ones double up to 16 frames (320 ms); the rest
    # leaves with the finish
    assert [len(c) // codec.frame_samples for c in chunks] == [1, 1, 2, 4, 8, 16, 16, 12]
    assert len(calls) == 8


def test_streams_out_of_step_fall_into_step(voice):
    v, codec = voice
    stage = AudioStage(codec, v.layout, 4, max_chunk_s=0.32, clock=Clock())
    calls = count_calls(stage)
    said = {r: speak(v, codec, 60, seed) for seed, r in enumerate("abc")}
    starts = {"a": 0, "b": 3, "c": 40}  # b half a frame behind a, c after a's ramp
    chunks = run(stage, {r: t for r, (_, t) in said.items()}, starts)
    for r, (codes, _) in said.items():
        whole = codec.decode(codes)[0].numpy()
        assert np.abs(np.concatenate(chunks[r]) - whole).max() <= codec.tolerance
        assert len(chunks[r][0]) == codec.frame_samples  # first audio after one frame
    # frame by frame this takes 180 calls; three streams alone, 24
    assert len(calls) <= 24, calls
    assert any(rows > 1 for rows, _ in calls)


def test_no_grouping_and_paced_requests_decode_each_step(voice):
    v, codec = voice
    codes, tokens = speak(v, codec, 20, 1)
    whole = codec.decode(codes)[0].numpy()
    for max_chunk_s, paced in ((0.0, False), (0.32, True)):
        stage = AudioStage(codec, v.layout, 2, max_chunk_s=max_chunk_s, clock=Clock())
        chunks = run(stage, {"a": tokens}, {"a": 0}, paced=paced)["a"]
        assert [len(c) for c in chunks] == [codec.frame_samples] * 20
        assert np.abs(np.concatenate(chunks) - whole).max() <= codec.tolerance


def test_a_client_about_to_run_dry_gets_its_frames_early(voice):
    """At 8 ms a step (2 steps a 20 ms frame: RTF 0.8) doubling alone would let the
    client's buffer run dry; the buffer rule releases the frames held in time."""
    v, codec = voice
    clock = Clock(step_s=0.008)
    stage = AudioStage(codec, v.layout, 2, max_chunk_s=0.32, clock=clock)
    _, tokens = speak(v, codec, 100, 2)
    play_end, dry = None, []
    for i, tok in enumerate(tokens):
        if i == 0:
            stage.open("a", AudioRequest())
        out = Out("a", [tok], finished=i == len(tokens) - 1)
        stage.process([out])
        assert out.audio is not None
        if len(out.audio):
            if play_end is not None and play_end < clock.now:
                dry.append(clock.now - play_end)
            play_end = played_until(play_end, clock.now, len(out.audio) / codec.sample_rate)
    assert not dry, dry
