"""Model-based drafters on the real default model: the target drafting for itself must
reproduce its own greedy continuation (100 % acceptance), a rolled-back cache drafts what
a fresh one would, blocks all come back, self-drafting equals the target's first layers,
and a pool that is too small gives empty drafts instead of failing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmserve.models.base import CausalLM
from mmserve.models.harness import SequenceRunner
from mmserve.models.registry import load_model
from mmserve.speculative.draft_model import DraftModelDrafter
from mmserve.speculative.drafter import DraftRequest
from mmserve.speculative.self_draft import SelfDrafter, TruncatedModel
from mmserve.speculative.verify import rejection_sample

PROMPT_A = [1, 504, 3458, 282, 4649, 314]  # short prompts keep every forward cheap on CPU
PROMPT_B = [1, 1017, 3299, 28, 253]


@pytest.fixture(scope="module")
def model(default_model_dir: Path) -> CausalLM:
    return load_model(default_model_dir)


@pytest.fixture(scope="module")
def greedy_a(model: CausalLM) -> list[int]:
    """The target's own greedy continuation of PROMPT_A (the independent reference)."""
    return SequenceRunner(model, max_len=64).greedy(PROMPT_A, 7)


def all_free(drafter: DraftModelDrafter) -> bool:
    blocks = drafter.kv.blocks
    blocks.check_invariants()
    return blocks.num_free_blocks == blocks.num_total_blocks


def test_target_drafting_for_itself_is_always_accepted(model: CausalLM, greedy_a: list[int]):
    greedy_b = SequenceRunner(model, max_len=64).greedy(PROMPT_B, 2)
    drafter = DraftModelDrafter(model, num_blocks=8, block_size=4)
    ids_a, ids_b = list(PROMPT_A), list(PROMPT_B)
    first = drafter.propose(
        [DraftRequest("a", ids_a, 3), DraftRequest("b", ids_b, 2), DraftRequest("idle", [5, 6], 0)]
    )
    assert first[0].tokens == greedy_a[:3] and first[0].probs is None
    assert first[1].tokens == greedy_b and first[2].tokens == []
    ids_a += greedy_a[:4]  # all 3 accepted + the bonus token: catch-up of 2 tokens
    (second,) = drafter.propose([DraftRequest("a", ids_a, 3)])
    assert second.tokens == greedy_a[4:7]
    for request_id in ("a", "b", "idle", "unknown"):
        drafter.on_finished(request_id)
    assert all_free(drafter)


@pytest.mark.parametrize("accepted,decoded", [(1, 0), (0, 2)])
def test_rollback_drafts_what_a_fresh_drafter_drafts(
    model: CausalLM, greedy_a: list[int], accepted: int, decoded: int
):
    """``decoded`` tokens decoded without drafting after the verify step (k = 0 steps)
    move the stale draft KV inside the new history, where only the rollback removes it."""
    drafter = DraftModelDrafter(model, num_blocks=8, block_size=4)
    ids = list(PROMPT_A)
    assert drafter.propose([DraftRequest("r", ids, 3)])[0].tokens == greedy_a[:3]
    correction = (greedy_a[accepted] + 1) % model.vocab_size  # the target disagreed here
    ids += greedy_a[:accepted] + [correction] + [504, 314][:decoded]
    rolled = drafter.propose([DraftRequest("r", ids, 2)])[0].tokens
    fresh_drafter = DraftModelDrafter(model, num_blocks=8, block_size=4)
    assert rolled == fresh_drafter.propose([DraftRequest("r", ids, 2)])[0].tokens
    assert drafter.kv.num_slots("r") == len(ids) + 1  # the history + the one draft fed back
    drafter.on_finished("r")
    assert all_free(drafter)


def test_truncated_model_equals_the_targets_first_layers(model: CausalLM):
    layers = 3
    view = TruncatedModel(model, layers)
    assert view.lm_head_weight().data_ptr() == model.lm_head_weight().data_ptr()
    assert view.target.layers[0].mlp is model.layers[0].mlp  # shared, not copied
    captured: list[torch.Tensor] = []  # layer L-1's output: full model first, then the view
    hook = model.layers[layers - 1].register_forward_hook(
        lambda _mod, _inp, out: captured.append(out.clone())
    )
    try:
        SequenceRunner(model, max_len=16).step(PROMPT_A, 0)  # all 30 layers
        got = SequenceRunner(view, max_len=16).step(PROMPT_A, 0)
    finally:
        hook.remove()
    assert torch.equal(captured[0], captured[1])
    normed = F.rms_norm(captured[0], (captured[0].shape[-1],), model.norm, model.eps)
    want = F.linear(normed, model.lm_head_weight())  # the target's final norm + LM head
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_self_drafter_is_deterministic_and_matches_truncated_greedy(model: CausalLM):
    reference = SequenceRunner(TruncatedModel(model, 2), max_len=32).greedy(PROMPT_B, 3)
    drafter = SelfDrafter(model, 2, num_blocks=4)
    assert drafter.kv.cache.shape[0] == 2  # (L, 2, blocks, bs, Hkv, D): the drafted layers only
    batch = [DraftRequest("x", PROMPT_B, 3), DraftRequest("y", PROMPT_A, 2)]
    drafts = drafter.propose(batch)
    assert drafts[0].tokens == reference
    again = SelfDrafter(model, 2, num_blocks=4).propose(list(reversed(batch)))
    assert [d.tokens for d in again] == [d.tokens for d in reversed(drafts)]
    for request in batch:
        drafter.on_finished(request.request_id)
    assert all_free(drafter)


def test_tiny_pool_gives_empty_drafts(model: CausalLM):
    drafter = SelfDrafter(model, 1, num_blocks=1, block_size=4)
    long, short = DraftRequest("long", PROMPT_A, 2), DraftRequest("short", [1, 504], 2)
    drafts = drafter.propose([long, short])
    assert drafts[0].tokens == [] and len(drafts[1].tokens) == 2  # 6 + 1 slots > 4 >= 2 + 1
    grown = [1, 504, *drafts[1].tokens]  # 3 slots kept, 3 more needed: out of blocks
    assert drafter.propose([DraftRequest("short", grown, 3)])[0].tokens == []
    assert len(drafter.propose([DraftRequest("short", grown, 1)])[0].tokens) == 1  # fits
    drafter.on_finished("short")
    assert drafter.propose([long])[0].tokens == []  # still too long alone
    assert all_free(drafter)


def test_temperature_aware_probs_are_real_and_accepted_by_the_same_model(model: CausalLM):
    view = TruncatedModel(model, 2)
    drafter = SelfDrafter(model, 2, num_blocks=4, temperature_aware=True, seed=7)
    draft = drafter.propose([DraftRequest("s", PROMPT_B, 3)])[0]
    assert draft.probs is not None and draft.probs.shape == (3, model.vocab_size)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(3))
    assert all(draft.probs[i, t] > 0 for i, t in enumerate(draft.tokens))
    same = SelfDrafter(model, 2, num_blocks=4, temperature_aware=True, seed=7)
    assert same.propose([DraftRequest("s", PROMPT_B, 3)])[0].tokens == draft.tokens
    # Verified by the very model that drafted: p == q, so every token is accepted.
    logits = SequenceRunner(view, max_len=32).step(PROMPT_B + draft.tokens, 0)
    target_probs = torch.softmax(logits[len(PROMPT_B) - 1 :], dim=-1)  # (k + 1, V)
    out = rejection_sample(target_probs, draft.tokens, draft.probs, torch.Generator())
    assert out[:3] == draft.tokens
