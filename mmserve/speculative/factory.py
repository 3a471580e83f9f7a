"""Building the speculator an engine is given, from the user's ``SpecConfig``.

Drafters that need no model (prompt lookup, an n-gram table) are built here outright;
a draft model is loaded beside the target, and self-drafting reuses the target's layers.
"""

from __future__ import annotations

import torch

from mmserve.models.base import CausalLM
from mmserve.speculative.config import SpecConfig
from mmserve.speculative.drafter import Drafter
from mmserve.speculative.speculator import Speculator


def build_speculator(
    spec: SpecConfig | None, model: CausalLM, device: torch.device, dtype: torch.dtype
) -> Speculator | None:
    """The drafter ``spec`` names wrapped for the engine (``model``: the target), or None."""
    if spec is None:
        return None
    drafter: Drafter
    if spec.method == "ngram":
        from mmserve.speculative.prompt_lookup import PromptLookupDrafter

        drafter = PromptLookupDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
    elif spec.method == "ngram_table":
        from mmserve.speculative.ngram_table import NgramTable, NgramTableDrafter

        assert spec.table_path is not None  # SpecConfig requires it for ngram_table
        drafter = NgramTableDrafter(NgramTable(spec.table_path, spec.table_in_memory))
    elif spec.method == "draft_model":
        from mmserve.models.hub import resolve_model
        from mmserve.models.registry import load_model
        from mmserve.speculative.draft_model import DraftModelDrafter

        draft = load_model(resolve_model(spec.draft_model), dtype, device)
        drafter = DraftModelDrafter(draft, device=device)
    else:
        from mmserve.speculative.self_draft import SelfDrafter

        drafter = SelfDrafter(model, spec.self_draft_layers or max(1, model.num_layers // 4))
    return Speculator(spec, drafter)
