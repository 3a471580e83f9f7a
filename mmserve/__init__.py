"""mmserve: a streaming multimodal and speech extension server around a
speculative-decoding LLM engine. ``from mmserve import LLM, SamplingParams``."""

from mmserve.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":  # lazy: importing SamplingParams must not load the engine
        from mmserve.llm import LLM

        return LLM
    raise AttributeError(name)
