"""The shipped default connector in the engine: the images of requests prefilled in one
step go through the encoder in one batched call, and each request's caption equals the
one it gets alone (batch invariance of the encoder, the projector and the LM)."""

import pytest
import torch

from connectors import synthetic
from connectors.prompt import IMAGE_MARKER, ImageChatPrompt, image_chat_prompt, splice_images
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


@pytest.mark.parametrize("num_images", [1, 2])
def test_a_reused_turn_equals_the_template_rendered_each_time(llm, num_images):
    """``ImageChatPrompt`` renders the template and tokenizes the text once; every call
    equals rendering and tokenizing from scratch (ids, spans, image token count)."""
    proc, tok = llm.engine.connector.processor, llm.tokenizer
    text = "Describe the image."
    turn = ImageChatPrompt(tok, proc, text, num_images)
    for k in range(3):
        imgs = [synthetic.sample("test", 400 + 2 * k + j)[0] for j in range(num_images)]
        content = IMAGE_MARKER * num_images + text
        rendered = tok.apply_chat_template([{"role": "user", "content": content}])
        want = splice_images(
            rendered, [proc.prepare(im) for im in imgs], lambda s: tok.encode(s, False)
        )
        got = turn(imgs)
        assert (got.ids, got.num_image_tokens) == (want.ids, want.num_image_tokens)
        assert [_plain(sp) for sp in got.spans] == [_plain(sp) for sp in want.spans]
        for a, b in zip(got.spans, want.spans, strict=True):
            assert torch.equal(a.payload, b.payload)
    with pytest.raises(ValueError, match="takes"):
        turn([])
    if num_images == 1:  # the batched form: the same prompts as one call an image
        imgs = [synthetic.sample("test", 410 + k)[0] for k in range(4)]
        for got, img in zip(turn.each(imgs), imgs, strict=True):
            want = turn([img])
            assert (got.ids, [_plain(sp) for sp in got.spans]) == (
                want.ids,
                [_plain(sp) for sp in want.spans],
            )
            pairs = zip(got.spans, want.spans, strict=True)
            assert all(torch.equal(a.payload, b.payload) for a, b in pairs)
    else:
        with pytest.raises(ValueError, match="one-image"):
            turn.each([])


def _plain(span) -> tuple:
    return (span.start, span.length, span.offset, span.digest, span.source)


def test_image_requests_admitted_into_steps_run_ahead_caption_as_synchronously(llm):
    """Two slots for five image requests under async scheduling (on CPU a test switch):
    a request whose slot frees at a stop string or EOS is admitted into the step launched
    ahead, its image
    encoded there, its whole prompt one chunk beside the decodes. Every caption, delta
    for delta, is the synchronous engine's."""
    eng = llm.engine
    proc = eng.connector.processor
    turn = ImageChatPrompt(llm.tokenizer, proc, "Describe the image.")
    images = [synthetic.sample("test", 500 + i)[0] for i in range(5)]

    def drive(overlap: bool) -> dict:
        eng.blocks.reset_prefix_cache()
        eng.spans.cache = EncoderCache(1 << 26)
        prompts = turn.each(images)  # fresh spans: a filled span keeps its vectors
        eng.async_scheduling = overlap
        got: dict[str, list] = {}
        try:
            for i, p in enumerate(prompts):
                # captions end at EOS after 9 tokens; a stop string ends some sooner
                stop = [" in"] if i % 2 == 0 else []
                params = SamplingParams(temperature=0, max_tokens=24, stop=stop)
                eng.add_request(p.ids, params, f"r{i}", spans=p.spans)
            while eng.has_unfinished():
                for out in eng.step():
                    got.setdefault(out.request_id, []).append(out.new_token_ids)
        finally:
            eng.async_scheduling = False
        return got

    sched = eng.scheduler
    slots, sched.max_num_seqs = sched.max_num_seqs, 2
    before = eng.launch.ahead_admissions
    try:
        sync = drive(False)
        mid = eng.stats().encoder_payloads_total
        ahead = drive(True)
    finally:
        sched.max_num_seqs = slots
    encoded = eng.stats().encoder_payloads_total
    assert eng.launch.ahead_admissions > before
    assert ahead == sync
    assert encoded - mid == 5  # every image encoded, those admitted ahead too
    assert eng.blocks.num_used_blocks == 0 and eng.launch.pending is None
