"""Speculative decoding: drafters, verification, the k controller, and the engine's glue.

Dependency direction: the engine imports this package; this package never imports
``mmserve.engine``. ``LLMEngine`` is given a ``Speculator`` (built by
``build_speculator`` from the user's ``SpecConfig``) and hands it the running requests,
the scheduled verify sequences and its sampler, which it reads through the protocols in
``interface.py``. Model drafters keep their own paged KV (``model_drafter.py``), apart
from the target's.

- ``speculator.py`` -- one engine step's speculation: choose k, draft, verify, account.
- ``controller.py`` (with ``acceptance.py``, ``cost_model.py``) -- k per request per step
  from measured acceptance and the batch's verify cost (docs/speculation.md).
- ``drafter.py`` -- the ``Drafter`` interface: ``propose(batch) -> drafts``.
  ``prompt_lookup.py`` looks up the request's own tokens; ``ngram_table.py`` a global
  table built offline (``ngram_build.py``, on-disk format ``ngram_format.py``);
  ``draft_model.py`` a smaller sibling model; ``self_draft.py`` the target's first layers.
- ``verify.py`` -- greedy and lossless rejection-sampling verification.
- ``config.py`` -- ``SpecConfig``, the user's settings.
"""

from mmserve.speculative.acceptance import SpecTotals
from mmserve.speculative.config import SpecConfig
from mmserve.speculative.controller import SpecController
from mmserve.speculative.drafter import Draft, Drafter, DraftRequest
from mmserve.speculative.factory import build_speculator
from mmserve.speculative.ngram_build import BuildStats, build_table, build_table_from_jsonl
from mmserve.speculative.ngram_format import NgramTableError
from mmserve.speculative.ngram_table import NgramTable, NgramTableDrafter, TableHit
from mmserve.speculative.prompt_lookup import PromptLookupDrafter
from mmserve.speculative.speculator import Speculator
from mmserve.speculative.verify import greedy_verify, rejection_sample

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
    "Speculator",
    "SpecTotals",
    "TableHit",
    "build_speculator",
    "build_table",
    "build_table_from_jsonl",
    "greedy_verify",
    "rejection_sample",
]
