"""The model protocol: a language model with a KV cache that can be rolled back.

A model works on one sequence at a time: the prompt, then the generated tokens.
For a decoder-only model both live in one sequence; for an encoder-decoder model
the prompt is the encoder input and the generated tokens are the decoder input.
Lengths below count generated tokens fed so far, so the decoding loop never needs
to know which kind it holds.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["LanguageModel", "ContextLengthError", "as_token_ids", "checked_token_ids"]


class ContextLengthError(ValueError):
    """The sequence does not fit in the model's context window."""


def as_token_ids(token_ids: torch.Tensor, name: str) -> torch.Tensor:
    """token_ids as a 1-D int64 tensor; a clear error naming `name` otherwise."""
    token_ids = torch.as_tensor(token_ids)
    if token_ids.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of token ids, got shape {tuple(token_ids.shape)}")
    return token_ids.to(torch.long)


def checked_token_ids(token_ids: torch.Tensor, name: str, vocab_size: int, model: str) -> torch.Tensor:
    """token_ids as a non-empty 1-D int64 tensor of ids in [0, vocab_size) (an id outside would read past the
    embedding table: an IndexError deep in the model); a clear error naming `name` or `model` otherwise."""
    token_ids = as_token_ids(token_ids, name)
    if token_ids.numel() == 0:
        raise ValueError(f"{name} must hold at least one token")
    low, high = torch.aminmax(token_ids)
    if int(low) < 0 or int(high) >= vocab_size:
        raise ValueError(f"{model}: token ids must lie in [0, {vocab_size})")
    return token_ids


@runtime_checkable
class LanguageModel(Protocol):
    """What the decoding loop and the model drafter need from a model."""

    name: str
    vocab_size: int  # width of the logits
    max_length: int  # most positions the model can attend over (prompt + generated for decoder-only)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Reset the cache, process prompt_ids [P]; return the next-token logits [V]."""
        ...

    def extend(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Feed generated tokens [n] after those already cached; return logits [n, V] (row i predicts the token after token_ids[i])."""
        ...

    @property
    def num_generated(self) -> int:
        """How many generated tokens are in the cache."""
        ...

    def rollback(self, num_generated: int) -> None:
        """Forget cached generated tokens beyond the first num_generated."""
        ...

    def room(self) -> int:
        """How many more tokens can still be fed before the context is full."""
        ...
