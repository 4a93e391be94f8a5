"""Prompt lookup first, a model draft otherwise: copying wins where the text repeats the context."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from specdecode.core.sampling import SamplingParams
from specdecode.drafters.base import Draft, Drafter, draft_sources
from specdecode.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["LookupThenModelDrafter"]


class LookupThenModelDrafter:
    """Proposes the prompt-lookup continuation when the context's last min_match tokens occurred earlier, else the model's draft.

    Exactness is untouched: which drafter proposes depends only on the context, and each
    reports the distribution it sampled from (one-hot for the lookup). Feedback goes to the
    drafter that made the proposal.
    """

    def __init__(self, model_drafter: Drafter, min_match: int = 3, max_match: int = 4) -> None:
        self.lookup = PromptLookupDrafter(max_ngram=max_match, min_ngram=min_match)
        self.model = model_drafter
        self.name = f"{self.lookup.name}+{model_drafter.name}"
        self.sources = (*self.lookup.sources, *draft_sources(model_drafter))
        self.lookup_drafts = 0  # proposals that came from the lookup
        self.model_drafts = 0
        self._last: Drafter | None = None

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lookup.start(prompt_ids)
        self.model.start(prompt_ids)
        self._last = None

    def propose(
        self, generated: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        draft = self.lookup.propose(generated, gamma, sampling, generator)
        if len(draft):
            self._last = self.lookup
            self.lookup_drafts += 1
            return draft
        self._last = self.model
        self.model_drafts += 1
        draft = self.model.propose(generated, gamma, sampling, generator)
        return draft if draft.source else dataclasses.replace(draft, source=self.model.name)

    def propose_within(self, generated: torch.Tensor, budget: Callable[[str], int], sampling: SamplingParams,
                       generator: torch.Generator | None) -> Draft:
        """propose, with each source asked for at most budget(source) tokens (a cost-aware draft length): the model
        drafts only where the lookup finds nothing and its own budget is not 0, so no draft token it pays for is
        cut unverified because the lookup's budget was longer."""
        draft = self.lookup.propose_within(generated, budget, sampling, generator)
        if len(draft):
            self._last = self.lookup
            self.lookup_drafts += 1
            return draft
        model_budget = max(budget(source) for source in draft_sources(self.model))
        if not model_budget:
            self._last = None
            return Draft.empty()
        self._last = self.model
        self.model_drafts += 1
        draft = self.model.propose(generated, model_budget, sampling, generator)
        return draft if draft.source else dataclasses.replace(draft, source=self.model.name)

    def observe(self, draft: Draft, num_accepted: int) -> None:
        if self._last is not None:
            self._last.observe(draft, num_accepted)
