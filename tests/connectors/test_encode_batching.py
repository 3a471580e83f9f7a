"""The shipped default connector in the engine: the images of requests prefilled in one
step go through the encoder in one batched call, and each request's caption equals the
one it gets alone (batch invariance of the encoder, the projector and the LM)."""

import pytest

from connectors import synthetic
from connectors.prompt import image_chat_prompt
from mmserve import LLM, SamplingParams
from mmserve.engine.span_encoder import EncoderCache

N = 3
GREEDY = SamplingParams(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def llm() -> LLM:
    llm = LLM(None, device="cpu", max_model_len=256, max_num_batched_tokens=2048)
    if llm.engine.connector is None:
        pytest.fail("the default model serves no connector: connectors/default is missing")
    return llm


def test_one_encode_for_the_images_of_requests_in_one_step(llm):
    proc = llm.engine.connector.processor
    images = [synthetic.sample("test", 300 + i)[0] for i in range(N)]
    prompts = [
        image_chat_prompt(llm.tokenizer, proc, [img], "Describe the image.") for img in images
    ]
    assert sum(len(p.ids) for p in prompts) <= 2048, "all prefills fit one step's budget"
    before = llm.engine.stats()
    together = llm.generate([p.ids for p in prompts], GREEDY, spans=[p.spans for p in prompts])
    after = llm.engine.stats()
    assert after.encoder_calls_total - before.encoder_calls_total == 1
    assert after.encoder_payloads_total - before.encoder_payloads_total == N
    # the reference: each request alone, its image encoded again (both caches forgotten)
    for img, got in zip(images, together, strict=True):
        llm.engine.blocks.reset_prefix_cache()
        llm.engine.spans.cache = EncoderCache(1 << 26)
        alone = image_chat_prompt(llm.tokenizer, proc, [img], "Describe the image.")
        assert llm.generate([alone.ids], GREEDY, spans=[alone.spans])[0].token_ids == got.token_ids
    assert llm.engine.stats().encoder_payloads_total - after.encoder_payloads_total == N
    assert llm.engine.blocks.num_used_blocks == 0
