"""Speculation through the live server: same text as plain decode, drafted/accepted
counts in ``usage``, acceptance metrics in /metrics."""

import httpx
import openai
import pytest
from live_server import LiveServer
from prometheus_client.parser import text_string_to_metric_families

from mmserve.config import EngineConfig
from mmserve.engine.async_engine import AsyncEngine

PARAGRAPH = (
    "The river town woke slowly. Fishermen pulled their boats onto the gravel, the "
    "baker opened his shutters, and the old ferry bell rang twice."
)


@pytest.fixture(scope="module")
def spec_server(default_model_dir):
    engine = AsyncEngine.from_config(
        EngineConfig(
            model=str(default_model_dir),
            speculative_config='{"method": "ngram", "num_speculative_tokens": 4}',
        )
    )
    with LiveServer(engine) as srv:
        yield srv
    engine.shutdown_sync()


def test_speculative_chat_matches_plain_and_reports_usage(spec_server, client):
    messages = [
        {"role": "user", "content": f"Repeat the following paragraph exactly.\n\n{PARAGRAPH}"}
    ]
    spec_client = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="x")
    got = spec_client.chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, max_tokens=32, temperature=0
    )
    plain = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, max_tokens=32, temperature=0
    )
    assert got.choices[0].message.content == plain.choices[0].message.content
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0

    text = httpx.get(spec_server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    mean = families["mmserve_spec_mean_accepted_length"].samples[0].value
    assert mean > 1.0
    by_pos = families["mmserve_spec_acceptance_rate_by_position"].samples
    assert by_pos and 0.0 < by_pos[0].value <= 1.0
