"""Verification of a draft against the target model: pure functions on one request's tensors.

The target scores the last accepted token plus the ``k`` drafted tokens in one pass,
giving ``k + 1`` next-token distributions (or argmaxes). Both functions return the
tokens to append this step: the accepted draft prefix plus one token from the target
(a correction at the first rejection, or a bonus token when all ``k`` are accepted),
so the result has 1..k+1 tokens and ``len(result) - 1`` draft tokens were accepted.

``greedy_verify`` reproduces greedy decoding exactly. ``rejection_sample`` is lossless
speculative sampling (Leviathan et al. 2023; Chen et al. 2023): every emitted token is
distributed exactly as the target's sampling distribution, whatever the drafter did.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# A residual with less mass than this is numerical noise (the draft and target
# distributions agree); the correction is then sampled from the target itself.
_RESIDUAL_EPS = 1e-12


def greedy_verify(target_argmax: Sequence[int], draft: Sequence[int]) -> list[int]:
    """Accepted draft prefix + the target's token at the first mismatch (or the bonus token).

    ``target_argmax[i]`` is the target's greedy token after the accepted context plus
    ``draft[:i]``; it has ``len(draft) + 1`` entries.
    """
    if len(target_argmax) != len(draft) + 1:
        raise ValueError(
            f"target_argmax needs len(draft) + 1 = {len(draft) + 1} entries, "
            f"got {len(target_argmax)}"
        )
    out: list[int] = []
    for target, drafted in zip(target_argmax, draft, strict=False):
        out.append(int(target))
        if int(target) != int(drafted):
            return out
    out.append(int(target_argmax[len(draft)]))
    return out


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> list[int]:
    """Lossless speculative sampling of one request.

    Args:
        target_probs: ``(k + 1, V)`` target sampling distributions (after temperature,
            top-k/p, ...); row ``i`` conditions on the context plus ``draft_tokens[:i]``.
        draft_tokens: the ``k`` drafted tokens.
        draft_probs: ``(k, V)`` the drafter's distributions the tokens were sampled from,
            or ``None`` for a deterministic drafter (each ``q`` is one-hot at its token).
        generator: source of every random draw (on ``target_probs``' device), so the
            result is a deterministic function of the generator's state.

    Draft token ``x_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``; at
    the first rejection the correction is sampled from ``normalize(max(0, p_i - q_i))``
    (from ``p_i`` if that is all zero); if all are accepted a bonus token is sampled
    from ``p_k``. A token with ``p(x) = 0`` is never accepted; one with ``q(x) = 0`` and
    ``p(x) > 0`` always is.
    """
    k = len(draft_tokens)
    _check_shapes(target_probs, k, draft_probs)
    if k == 0:
        return [_sample(target_probs[0], generator)]
    device = target_probs.device
    rows = torch.arange(k, device=device)
    cols = torch.as_tensor(list(draft_tokens), dtype=torch.long, device=device)
    p_x = target_probs[rows, cols].float()  # (k,)
    q_x = draft_probs[rows, cols].float() if draft_probs is not None else torch.ones_like(p_x)
    u = torch.rand(k, generator=generator, device=device)  # (k,) uniforms in [0, 1)
    # u < p/q written without the division, so q = 0 accepts and p = 0 rejects.
    accepted = u * q_x < p_x
    num_accepted = int(accepted.long().cumprod(0).sum())  # length of the accepted prefix
    out = [int(t) for t in draft_tokens[:num_accepted]]
    if num_accepted == k:
        return out + [_sample(target_probs[k], generator)]
    q_row = draft_probs[num_accepted] if draft_probs is not None else None
    residual = _residual(target_probs[num_accepted], q_row, int(draft_tokens[num_accepted]))
    return out + [_sample(residual, generator)]


def _residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """Unnormalised ``max(0, p - q)`` (``q`` one-hot at ``token`` when ``None``); ``p`` if empty."""
    p = p.float()
    if q is None:
        residual = p.clone()
        residual[token] = 0.0
    else:
        residual = (p - q.float()).clamp_min(0.0)
    # Chosen on the device (no host sync); multinomial normalises.
    return torch.where(residual.sum() > _RESIDUAL_EPS, residual, p)


def _sample(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One index drawn with probability proportional to ``weights`` (V,)."""
    return int(torch.multinomial(weights.float(), 1, generator=generator))


def _check_shapes(target_probs: torch.Tensor, k: int, draft_probs: torch.Tensor | None) -> None:
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"target_probs must be (k + 1, V) = ({k + 1}, V) for {k} draft tokens, "
            f"got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (k, target_probs.shape[1]):
        raise ValueError(
            f"draft_probs must be (k, V) = ({k}, {target_probs.shape[1]}), "
            f"got {tuple(draft_probs.shape)}"
        )
