"""Speculative decoding building blocks: drafters, verification, the k controller, config.

Drafters implement ``Drafter.propose`` (``drafter.py``): ``PromptLookupDrafter`` looks
up the request's own tokens, ``NgramTableDrafter`` a global table built offline
(``ngram_build.build_table``). ``verify.py`` holds greedy and lossless rejection-sampling
verification; ``SpecController`` chooses k per request per step; ``SpecConfig`` holds
the user's settings.
"""

from mmserve.spec.acceptance import SpecTotals
from mmserve.spec.config import SpecConfig
from mmserve.spec.controller import SpecController
from mmserve.spec.drafter import Draft, Drafter, DraftRequest
from mmserve.spec.ngram_build import BuildStats, build_table, build_table_from_jsonl
from mmserve.spec.ngram_format import NgramTableError
from mmserve.spec.ngram_table import NgramTable, NgramTableDrafter, TableHit
from mmserve.spec.prompt_lookup import PromptLookupDrafter
from mmserve.spec.verify import greedy_verify, rejection_sample

__all__ = [
    "BuildStats",
    "Draft",
    "DraftRequest",
    "Drafter",
    "NgramTable",
    "NgramTableDrafter",
    "NgramTableError",
    "PromptLookupDrafter",
    "SpecConfig",
    "SpecController",
    "SpecTotals",
    "TableHit",
    "build_table",
    "build_table_from_jsonl",
    "greedy_verify",
    "rejection_sample",
]
