"""The drafter protocol: propose gamma tokens and, optionally, the distributions they came from.

Drafters know nothing about acceptance (as vLLM's proposers); the decoding loop
reports the outcome of each verification through `observe`, a feedback hook a
drafter may use to adapt (as Hugging Face's candidate generators).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specdecode.core.sampling import SamplingParams

__all__ = ["Draft", "Drafter", "check_min_confidence", "draft_sources", "unsure"]


@dataclass(frozen=True)
class Draft:
    """Proposed tokens [g] and the exact distributions q [g, V] they were sampled from.

    probs is None for a deterministic draft (q is one-hot at each proposed token). source: which of a
    drafter's `sources` made it, for a cost-aware draft length (None: the drafter itself).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1:
            raise ValueError(f"Draft.tokens must be 1-D, got shape {tuple(self.tokens.shape)}")
        if self.probs is not None and (self.probs.dim() != 2 or self.probs.shape[0] != self.tokens.shape[0]):
            raise ValueError(
                f"Draft.probs must have shape [{self.tokens.shape[0]}, V], got {tuple(self.probs.shape)}"
            )

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def truncated(self, length: int) -> "Draft":
        """The first `length` tokens (and their q): still exactly what the draft sampled, just shorter."""
        probs = None if self.probs is None else self.probs[:length]
        return Draft(self.tokens[:length], probs, self.source)

    @staticmethod
    def empty() -> "Draft":
        return Draft(torch.zeros(0, dtype=torch.long))


@runtime_checkable
class Drafter(Protocol):
    """A swappable source of draft tokens.

    A drafter may also have `sources`, the names its drafts' `Draft.source` take (prompt lookup per match
    length, a model), for the loop's cost-aware draft length to learn each one's acceptance apart, and
    `propose_within(generated, budget, sampling, generator)`, proposing at most budget(source) tokens from
    each source (`LookupThenModelDrafter`: the model drafts nothing where its budget is 0).
    """

    name: str

    def start(self, prompt_ids: torch.Tensor) -> None:
        """Begin a new sequence with prompt_ids [P]."""
        ...

    def propose(
        self, generated: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """Propose up to gamma tokens to follow prompt + generated [G] (fewer, even none, is allowed)."""
        ...

    def observe(self, draft: Draft, num_accepted: int) -> None:
        """Feedback after verification: how many tokens of `draft` the target kept."""
        ...


def draft_sources(drafter: Drafter) -> tuple[str, ...]:
    """The names a drafter's drafts may carry as `Draft.source`: its `sources`, or its own name."""
    return tuple(getattr(drafter, "sources", (drafter.name,)))


def check_min_confidence(value: float) -> float:
    """value itself, or a ValueError naming the parameter: a model draft's early-end threshold, a probability."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"min_confidence must be a number in [0, 1], got {value!r}")
    return value


def unsure(logits: torch.Tensor, q: torch.Tensor | None, index: int, min_confidence: float) -> bool:
    """Whether a model draft ends after the token at `index` of logits [K]: its q is below min_confidence.

    q [K]: the distribution the token was sampled from; None at T=0, where the confidence is the softmax of
    the logits (EAGLE-2's), since the greedy q is one-hot. The draft's length then depends on the draft's own
    distributions only, so the output stays distributed as the target's. min_confidence 0 never ends a draft.
    """
    if min_confidence == 0.0:
        return False
    confidence = torch.softmax(logits.float(), dim=-1)[index] if q is None else q[index]
    return float(confidence) < min_confidence
