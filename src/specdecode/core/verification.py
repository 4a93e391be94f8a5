"""Verification of a draft against the target: Algorithm 1 of Leviathan et al. (2023).

Pure tensor code: no model, no tokenizer. Given gamma draft tokens, the draft's
distributions q they were sampled from (or None for a deterministic draft, i.e.
one-hot q) and the target's distributions p at gamma + 1 positions, keep the
longest accepted prefix and emit one more token, so that the output is
distributed exactly as samples from p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.core.sampling import sample

__all__ = ["Verification", "verify", "verify_greedy"]


@dataclass(frozen=True)
class Verification:
    """Outcome of one verification step.

    num_accepted: how many draft tokens were kept (0..gamma).
    next_token: the token emitted after them (residual sample on rejection, bonus token otherwise).
    """

    num_accepted: int
    next_token: int


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verification:
    """Modified rejection sampling (Algorithm 1).

    draft_tokens: [g] int64, the proposed tokens x_1..x_g.
    draft_probs:  [g, Vq] q at each draft position, or None when the draft is
                  deterministic (q is one-hot at the proposed token).
    target_probs: [g + 1, Vp] p at each draft position plus the bonus position.
    Vq may differ from Vp: q is zero beyond its width, p is zero beyond its width.

    Token x_i is accepted when r_i * q(x_i) < p(x_i) with r_i ~ U[0, 1): the strict
    test never accepts a token the target gives probability 0. On the first rejection
    the next token is drawn from norm(max(0, p - q)); if all are accepted the bonus
    token is drawn from p at position g + 1.
    """
    gamma = draft_tokens.shape[0]
    if target_probs.shape[0] != gamma + 1:
        raise ValueError(f"target_probs must have gamma + 1 = {gamma + 1} rows, got {target_probs.shape[0]}")
    if draft_probs is not None and draft_probs.shape[0] != gamma:
        raise ValueError(f"draft_probs must have gamma = {gamma} rows, got {draft_probs.shape[0]}")
    if gamma == 0:
        return Verification(0, int(sample(target_probs[0], generator)))

    p = target_probs.float()
    vocab_p = p.shape[-1]
    rows = torch.arange(gamma)
    in_vocab = draft_tokens < vocab_p
    p_x = torch.where(in_vocab, p[rows, draft_tokens.clamp(max=vocab_p - 1)], 0.0)  # [g]
    q_x = torch.ones(gamma) if draft_probs is None else draft_probs.float()[rows, draft_tokens]  # [g]

    r = torch.rand(gamma, generator=generator)
    accepted = r * q_x < p_x  # [g] bool, strict
    num_accepted = int(accepted.long().cumprod(dim=0).sum())
    if num_accepted == gamma:
        return Verification(gamma, int(sample(p[gamma], generator)))

    residual = _residual(p[num_accepted], draft_tokens[num_accepted], None if draft_probs is None else draft_probs[num_accepted])
    return Verification(num_accepted, int(sample(residual, generator)))


def _residual(p: torch.Tensor, draft_token: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """norm(max(0, p - q)) over p's vocabulary, [V] -> [V].

    The residual can only sum to zero when p == q, in which case no rejection can
    happen in exact arithmetic; if rounding makes it so anyway, the excess mass of p
    over q is below float precision and p itself is the right distribution.
    """
    if q is None:
        residual = p.clone()
        if int(draft_token) < residual.shape[0]:
            residual[int(draft_token)] = 0.0
    else:
        q = q.float()
        width = p.shape[0]
        if q.shape[0] < width:
            q = torch.nn.functional.pad(q, (0, width - q.shape[0]))
        residual = (p - q[:width]).clamp_(min=0.0)
    total = residual.sum()
    if not total > 0:
        return p
    return residual / total


def verify_greedy(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> Verification:
    """Greedy verification: the temperature-0 case of `verify`, without randomness.

    draft_tokens:  [g] the proposed tokens.
    target_tokens: [g + 1] the target's argmax at each position.
    Accept while the draft equals the target's argmax; emit the target's argmax next.
    """
    gamma = draft_tokens.shape[0]
    if target_tokens.shape[0] != gamma + 1:
        raise ValueError(f"target_tokens must have gamma + 1 = {gamma + 1} entries, got {target_tokens.shape[0]}")
    matches = (draft_tokens == target_tokens[:gamma]).long()
    num_accepted = int(matches.cumprod(dim=0).sum())
    return Verification(num_accepted, int(target_tokens[num_accepted]))
