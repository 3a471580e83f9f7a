"""``mmserve say`` and ``mmserve voices`` on a tiny random voice of the default voice's
kind (its every output token is a code: each piece speaks exactly its max_tokens frames)."""

from __future__ import annotations

import soundfile

from mmserve.cli import main
from tts.random_voice import random_phoneme_voice
from tts.registry import OPENAI_VOICES, load


def test_say_writes_audio_files_soundfile_reads_at_24khz(tmp_path, capsys):
    voice = random_phoneme_voice(tmp_path / "voice")
    frames = sum(
        load(str(voice)).sampling(p).max_tokens for p in load(str(voice)).prompts("Hi. Bye.")
    )
    out = tmp_path / "hello.wav"
    assert (
        main(["say", "Hi. Bye.", "--out", str(out), "--voice", str(voice), "--device", "cpu"]) == 0
    )
    info = soundfile.info(str(out))
    assert info.samplerate == 24000 and info.channels == 1 and info.frames == frames * 480
    assert main(["voices", "--voice", str(voice)]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in OPENAI_VOICES)
