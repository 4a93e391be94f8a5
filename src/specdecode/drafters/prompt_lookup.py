"""Prompt-lookup drafting: copy what followed the longest earlier match of the context's suffix."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdecode.core.sampling import SamplingParams
from specdecode.drafters.base import Draft

__all__ = ["PromptLookupDrafter", "find_continuation", "find_match"]


class PromptLookupDrafter:
    """Deterministic n-gram drafter (Saxena's prompt lookup decoding).

    Finds the longest suffix of the context (max_ngram tokens down to min_ngram)
    that occurred earlier in the context (prompt + generated) and proposes the
    tokens that followed its most recent occurrence. The draft is one-hot (no q). Its source names the
    length of the match ("ngram:1-3@3"): a long match is right more often than a short one.
    An index of every n-gram's latest position (`NgramIndex`) grows with the context, so a proposal costs
    the same after 10 tokens as after 2,000 (the same drafts as `find_continuation`).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {min_ngram}")
        if max_ngram < min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram ({min_ngram}), got {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = f"ngram:{min_ngram}-{max_ngram}"
        self.sources = tuple(f"{self.name}@{n}" for n in range(min_ngram, max_ngram + 1))
        self._prompt: list[int] = []
        self._index = NgramIndex(max_ngram, min_ngram)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids.to(torch.long).tolist()
        self._index = NgramIndex(self.max_ngram, self.min_ngram)

    def propose(
        self, generated: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        tokens, matched = self._index.match(self._prompt + generated.tolist(), gamma)
        return Draft(torch.tensor(tokens, dtype=torch.long), source=f"{self.name}@{matched}" if matched else None)

    def propose_within(self, generated: torch.Tensor, budget: Callable[[str], int], sampling: SamplingParams,
                       generator: torch.Generator | None) -> Draft:
        """propose, up to the largest budget(source) of its sources (the loop keeps what the match's source pays for)."""
        return self.propose(generated, max(budget(source) for source in self.sources), sampling, generator)

    def observe(self, draft: Draft, num_accepted: int) -> None:
        """Stateless: nothing to learn from the outcome."""


class NgramIndex:
    """The latest start of every n-gram (min_ngram <= n <= max_ngram) of a growing context that has a successor.

    match(context) indexes the tokens added since the last call (a context that is not an extension of the last
    one is indexed from scratch) and returns what find_match would.
    """

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self._context: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> its latest start s with s + n < len(context)

    def match(self, context: list[int], gamma: int) -> tuple[list[int], int]:
        """Up to gamma tokens after the latest earlier occurrence of the longest matching suffix, and its length."""
        old = len(self._context)
        if len(context) < old or context[:old] != self._context:
            self._latest, old = {}, 0
        self._context = context
        for end in range(max(old, 1), len(context)):  # n-grams ending at end - 1 now have a successor
            for n in self.sizes:
                if end >= n:
                    self._latest[tuple(context[end - n:end])] = end - n
        length = len(context)
        for n in self.sizes:
            if n < length:
                start = self._latest.get(tuple(context[length - n:]))
                if start is not None:
                    return context[start + n:start + n + gamma], n
        return [], 0


def find_continuation(context: torch.Tensor, gamma: int, max_ngram: int, min_ngram: int = 1) -> torch.Tensor:
    """Up to gamma tokens that followed the most recent earlier occurrence of the longest matching suffix.

    context: [L] token ids. Returns [g] with 0 <= g <= gamma (empty when nothing matches).
    """
    return find_match(context, gamma, max_ngram, min_ngram)[0]


def find_match(context: torch.Tensor, gamma: int, max_ngram: int, min_ngram: int = 1) -> tuple[torch.Tensor, int]:
    """find_continuation's tokens [g] and the length of the suffix it matched (0: no match)."""
    length = context.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = context[length - n :]
        windows = context[: length - 1].unfold(0, n, 1)  # [L - n, n]: every n-gram that has a successor
        starts = (windows == suffix).all(dim=1).nonzero().flatten()
        if len(starts):
            begin = int(starts[-1]) + n
            return context[begin : begin + gamma].clone(), n
    return torch.zeros(0, dtype=torch.long), 0
