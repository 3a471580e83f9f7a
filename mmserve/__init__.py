"""mmserve: a streaming multimodal and speech extension server around a
speculative-decoding LLM engine. ``from mmserve import LLM, SamplingParams``."""

from mmserve.sampling_params import SamplingParams

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":  # lazy: importing SamplingParams must not load the engine
        from mmserve.llm import LLM

        return LLM
    raise AttributeError(name)
