"""Weightless models for tests: logits are a fixed random table indexed by the last two tokens."""

from __future__ import annotations

import itertools

import torch

from specdecode.core.sampling import SamplingParams, probabilities
from specdecode.drafters.base import Draft
from specdecode.models.base import ContextLengthError


class TableModel:
    """A `LanguageModel` whose next-token logits depend on the last two tokens only.

    logits(context) = table[context[-2], context[-1]]  ([V]); cheap enough to sample
    tens of thousands of sequences, and its exact distribution is easy to enumerate.
    `mask` (bool [V]) sets the logits of masked tokens to -inf everywhere.
    """

    def __init__(self, vocab_size: int, seed: int, scale: float = 1.5, mask: torch.Tensor | None = None, max_length: int = 1024):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab_size, vocab_size, vocab_size, generator=g) * scale
        if mask is not None:
            self.table[..., mask] = float("-inf")
        self.name = f"table-{seed}"
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.calls = 0
        self._prompt: list[int] = []
        self._generated: list[int] = []

    def logits_after(self, context: list[int]) -> torch.Tensor:
        return self.table[context[-2], context[-1]]

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        if len(prompt_ids) < 2:
            raise ValueError("TableModel needs a prompt of at least two tokens")
        if len(prompt_ids) >= self.max_length:
            raise ContextLengthError("prompt too long")
        self.calls += 1
        self._prompt = prompt_ids.tolist()
        self._generated = []
        return self.logits_after(self._prompt).clone()

    def extend(self, token_ids: torch.Tensor) -> torch.Tensor:
        if len(token_ids) > self.room():
            raise ContextLengthError("context full")
        self.calls += 1
        rows = []
        for token in token_ids.tolist():
            self._generated.append(token)
            rows.append(self.logits_after(self._prompt + self._generated))
        return torch.stack(rows).clone()

    @property
    def num_generated(self) -> int:
        return len(self._generated)

    def rollback(self, num_generated: int) -> None:
        assert 0 <= num_generated <= len(self._generated)
        del self._generated[num_generated:]

    def room(self) -> int:
        return self.max_length - len(self._prompt) - len(self._generated)

    def sequence_distribution(self, prompt: list[int], length: int, sampling: SamplingParams) -> dict[tuple[int, ...], float]:
        """The exact probability of every continuation of `length` tokens under `sampling`."""
        out = {}
        for seq in itertools.product(range(self.vocab_size), repeat=length):
            context, prob = list(prompt), 1.0
            for token in seq:
                prob *= float(probabilities(self.logits_after(context), sampling)[token])
                context.append(token)
                if prob == 0.0:
                    break
            if prob > 0.0:
                out[seq] = prob
        return out


class SuccessorDrafter:
    """A deterministic drafter: proposes (last + 1) mod V, (last + 2) mod V, ... with no q (one-hot)."""

    name = "successor"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._prompt = torch.zeros(0, dtype=torch.long)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = prompt_ids

    def propose(self, generated, gamma, sampling, generator) -> Draft:
        last = int(generated[-1]) if len(generated) else int(self._prompt[-1])
        return Draft(torch.tensor([(last + i + 1) % self.vocab_size for i in range(gamma)]))

    def observe(self, draft, num_accepted) -> None:
        pass
