"""A drafter backed by any `LanguageModel` (a smaller model of the target's family)."""

from __future__ import annotations

import logging

import torch

from specdecode.core.sampling import SamplingParams, probabilities, sample
from specdecode.drafters.base import Draft, check_min_confidence, unsure
from specdecode.models.base import ContextLengthError, LanguageModel

__all__ = ["ModelDrafter"]

logger = logging.getLogger(__name__)


class ModelDrafter:
    """Samples gamma tokens autoregressively from a draft model and returns the q they came from.

    The draft model's cache is kept in step with the sequence by its longest common
    prefix with the tokens generated so far, so rejected draft tokens are rolled back
    and accepted ones are never fed twice.
    min_confidence: the draft stops early, before gamma tokens, after a token its own q gave less than this
    (`drafters.base.unsure`; Hugging Face's assistant_confidence_threshold). 0 always drafts gamma.
    """

    def __init__(self, model: LanguageModel, min_confidence: float = 0.0) -> None:
        self.model = model
        self.min_confidence = float(check_min_confidence(min_confidence))
        self.name = f"model:{model.name}"
        self.forward_calls = 0
        self._fed = torch.zeros(0, dtype=torch.long)  # generated tokens in the draft's cache
        self._prompt_logits: torch.Tensor | None = None  # [V] after the prompt
        self._last_logits: torch.Tensor | None = None  # [V] after self._fed, when known
        self._started = False

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._fed = torch.zeros(0, dtype=torch.long)
        try:
            self._prompt_logits = self.model.prefill(prompt_ids)
        except ContextLengthError as error:  # the target may still fit it: it then decodes alone
            logger.warning("draft %s cannot take this prompt, the target decodes alone: %s", self.model.name, error)
            self._prompt_logits = None
        self.forward_calls += 1
        self._last_logits = self._prompt_logits
        self._started = True

    def _sync(self, generated: torch.Tensor) -> torch.Tensor:
        """Bring the draft's cache to prompt + generated; return the next-token logits [V]."""
        n = min(len(self._fed), len(generated))
        differs = (self._fed[:n] != generated[:n]).nonzero()
        common = int(differs[0]) if len(differs) else n
        if common < len(self._fed):
            self.model.rollback(common)
            self._fed = self._fed[:common]
            self._last_logits = self._prompt_logits if common == 0 else None
        if self._last_logits is None and common == len(generated):  # nothing new to feed, but its logits were dropped
            common -= 1
            self.model.rollback(common)
            self._fed = self._fed[:common]
        to_feed = generated[common:]
        if len(to_feed):
            self._last_logits = self.model.extend(to_feed)[-1]
            self.forward_calls += 1
            self._fed = generated.clone()
        return self._last_logits

    def propose(
        self, generated: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        if not self._started:
            raise RuntimeError("call start() before propose()")
        if self._prompt_logits is None or self.model.room() + len(self._fed) < len(generated):
            return Draft.empty()  # the sequence outgrew the draft's context window: the target goes on alone
        logits = self._sync(generated)
        gamma = min(gamma, self.model.room() + 1)  # each token but the last is fed back
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(gamma):
            q = probabilities(logits, sampling)  # [V]
            token = int(q.argmax()) if sampling.greedy else int(sample(q, generator))
            tokens.append(token)
            probs.append(q)
            if i + 1 == gamma or unsure(logits, None if sampling.greedy else q, token, self.min_confidence):
                break
            logits = self.model.extend(torch.tensor([token]))[-1]
            self.forward_calls += 1
            self._fed = torch.cat([self._fed, torch.tensor([token])])
            self._last_logits = logits
        token_tensor = torch.tensor(tokens, dtype=torch.long)
        if sampling.greedy or not tokens:  # q is one-hot at each proposed token
            return Draft(token_tensor)
        return Draft(token_tensor, torch.stack(probs))

    def observe(self, draft: Draft, num_accepted: int) -> None:
        """Rollback happens lazily in the next `propose`, when the sequence is known."""
