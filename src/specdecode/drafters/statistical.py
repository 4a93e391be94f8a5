"""Unigram and bigram drafters fitted from token sequences: the paper's Table 3 baselines."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from specdecode.core.sampling import SamplingParams, probabilities, sample
from specdecode.drafters.base import Draft

__all__ = ["UnigramDrafter", "BigramDrafter"]


def _unigram_probs(sequences: Iterable[Sequence[int]], vocab_size: int, smoothing: float) -> torch.Tensor:
    counts = torch.full((vocab_size,), float(smoothing), dtype=torch.float64)
    for seq in sequences:
        ids = torch.as_tensor(list(seq), dtype=torch.long)
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"sequences hold token ids outside [0, {vocab_size})")
        counts += torch.bincount(ids, minlength=vocab_size).double()
    if counts.sum() <= 0:
        raise ValueError("sequences are empty and smoothing is 0: nothing to fit")
    return (counts / counts.sum()).float()


class UnigramDrafter:
    """Samples every draft token independently from the corpus' token frequencies (add-`smoothing`)."""

    def __init__(self, probs: torch.Tensor) -> None:
        self.log_probs = probs.clamp_min(0).log()  # [V], used as logits
        self.name = "unigram"

    @classmethod
    def fit(cls, sequences: Iterable[Sequence[int]], vocab_size: int, smoothing: float = 1.0) -> "UnigramDrafter":
        return cls(_unigram_probs(sequences, vocab_size, smoothing))

    def start(self, prompt_ids: torch.Tensor) -> None:
        """Context-free: nothing to prepare."""

    def propose(
        self, generated: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        q = probabilities(self.log_probs, sampling)  # [V]
        if sampling.greedy:
            return Draft(q.argmax().repeat(gamma))
        qs = q.expand(gamma, -1)
        return Draft(sample(qs, generator), qs.clone())

    def observe(self, draft: Draft, num_accepted: int) -> None:
        """Fixed model: nothing to learn."""


class BigramDrafter:
    """Samples each draft token from q(x | previous token), interpolated with the unigram:

    q(x | y) = lam * c(y, x) / c(y) + (1 - lam) * unigram(x).
    """

    def __init__(self, unigram: torch.Tensor, successors: dict[int, tuple[torch.Tensor, torch.Tensor]], lam: float) -> None:
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        self.unigram = unigram  # [V]
        self.successors = successors  # prev -> (next ids [k], conditional probs [k])
        self.lam = lam
        self.name = "bigram"
        self._prompt = torch.zeros(0, dtype=torch.long)

    @classmethod
    def fit(
        cls, sequences: Iterable[Sequence[int]], vocab_size: int, smoothing: float = 1.0, lam: float = 0.9
    ) -> "BigramDrafter":
        sequences = [list(s) for s in sequences]
        unigram = _unigram_probs(sequences, vocab_size, smoothing)
        pair_counts: dict[int, dict[int, int]] = {}
        for seq in sequences:
            for prev, nxt in zip(seq, seq[1:]):
                row = pair_counts.setdefault(prev, {})
                row[nxt] = row.get(nxt, 0) + 1
        successors = {}
        for prev, row in pair_counts.items():
            ids = torch.tensor(list(row.keys()), dtype=torch.long)
            counts = torch.tensor(list(row.values()), dtype=torch.float32)
            successors[prev] = (ids, counts / counts.sum())
        return cls(unigram, successors, lam)

    def conditional(self, prev: int) -> torch.Tensor:
        """q(. | prev) before the sampling transform, [V]."""
        if prev not in self.successors:
            return self.unigram
        ids, probs = self.successors[prev]
        q = (1.0 - self.lam) * self.unigram
        return q.index_add(0, ids, self.lam * probs)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids.to(torch.long)

    def propose(
        self, generated: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        last = generated[-1] if len(generated) else self._prompt[-1]
        prev = int(last)
        tokens, qs = [], []
        for _ in range(gamma):
            q = probabilities(self.conditional(prev).clamp_min(0).log(), sampling)
            prev = int(q.argmax()) if sampling.greedy else int(sample(q, generator))
            tokens.append(prev)
            qs.append(q)
        tokens_t = torch.tensor(tokens, dtype=torch.long)
        if sampling.greedy or not tokens:
            return Draft(tokens_t)
        return Draft(tokens_t, torch.stack(qs))

    def observe(self, draft: Draft, num_accepted: int) -> None:
        """Fixed model: nothing to learn."""
