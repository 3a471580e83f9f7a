"""The browser voice page (``GET /demo/voice``) in headless Chromium, driven by Playwright.

The system's Chromium (Debian's ``chromium``; no browser is downloaded) opens the page
on a live server with a voice, types a question and presses Ask; the page speaks the
answer through WebAudio with its jitter buffer. The test waits until every buffer it
scheduled has played and reads ``window.voiceStats``: audio arrived (as many samples as
the voice made for the answer), played to the end without an underrun, and the
transcript on the page is the answer. Skipped where Chromium or Playwright is missing.
"""

from __future__ import annotations

import os
import shutil

import pytest
from live_server import LiveServer
from test_realtime_audio import FRAME, SHORT, SlowScript, _frames

from mmserve.config import ServerConfig
from mmserve.models.tokenizer import Tokenizer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
]

playwright = pytest.importorskip("playwright.sync_api")
if not os.path.exists(CHROMIUM):
    pytest.skip("no system chromium (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    from tts.random_voice import random_phoneme_voice
    from tts.service import SpeechService

    path = random_phoneme_voice(tmp_path_factory.mktemp("voice"))
    svc = SpeechService.start(str(path), "cpu", max_num_seqs=8, kv_cache_memory_mb=32)
    yield svc
    svc.shutdown()


@pytest.fixture(scope="module")
def srv(speech, default_model_dir):
    text = SlowScript(Tokenizer(default_model_dir), delay=0.01)
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning")
    with LiveServer(text, config, speech=speech) as live:
        yield live


def test_page_speaks_the_answer_without_gaps(srv, speech) -> None:
    from tts.text import ClauseStream

    want = sum(_frames(speech, c) for c in ClauseStream().feed(SHORT + " ")) * FRAME
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(f"{srv.url}/demo/voice?buffer_ms=400")
            page.fill("#text", "Briefly: what is the capital of France?")
            page.click("#send")
            page.wait_for_function(
                "() => voiceStats.done && voiceStats.scheduled > 0 && "
                "voiceStats.ended === voiceStats.scheduled",
                timeout=120_000,
            )
            stats = page.evaluate("() => voiceStats")
            shown = page.inner_text("#log")
        finally:
            browser.close()
    assert stats["status"] == "completed" and not stats["errors"]
    assert stats["samples"] == want  # every frame of the answer arrived
    assert stats["underruns"] == 0 and stats["silenceMs"] == 0  # and played without a gap
    assert stats["transcript"].split() == SHORT.split()
    assert SHORT.split()[-1] in shown
