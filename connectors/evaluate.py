"""Held-out accuracy of a connector's captions on generated images.

Images of the generator's "test" split (never trained on) are captioned through the
serving path (``mmserve.LLM`` with the connector as its span encoder, greedy), and
each caption is scored per attribute (colour, shape, count, position) by
``synthetic.score_caption``. ``mmserve connector eval DIR`` prints the JSON::

    {"n": 200, "accuracy": {"colour": .., "shape": .., "count": .., "position": ..},
     "mean": .., "all_four": .., "examples": [...]}
"""

from __future__ import annotations

from connectors import synthetic
from connectors.prompt import ImageChatPrompt


def evaluate_connector(
    path: str,
    lm: str | None = None,
    n: int = 200,
    device: str = "auto",
    max_tokens: int = 24,
    instruction: str | None = None,
) -> dict:
    from mmserve import LLM, SamplingParams

    llm = LLM(lm, device=device, connector=path, max_model_len=512)
    connector = llm.engine.connector
    assert connector is not None, f"{path} did not load as a connector"
    text = str(instruction or getattr(connector.config, "prompt", "Describe the image."))
    scenes = [synthetic.sample("test", i) for i in range(n)]
    turn = ImageChatPrompt(llm.tokenizer, connector.processor, text)
    prompts = turn.each([img for img, _ in scenes])
    outs = llm.generate(
        [p.ids for p in prompts],
        SamplingParams(temperature=0, max_tokens=max_tokens),
        spans=[p.spans for p in prompts],
    )
    scores = [synthetic.score_caption(o.text, s) for o, (_, s) in zip(outs, scenes, strict=True)]
    acc = {a: sum(sc[a] for sc in scores) / n for a in synthetic.ATTRIBUTES}
    return {
        "n": n,
        "instruction": text,
        "accuracy": acc,
        "mean": sum(acc.values()) / len(acc),
        "all_four": sum(all(sc.values()) for sc in scores) / n,
        "examples": [
            {"truth": s.caption(), "caption": o.text}
            for o, (_, s) in list(zip(outs, scenes, strict=True))[:8]
        ],
    }
