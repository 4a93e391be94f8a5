"""A drafter of one's own for each sequence of a batch: the same draft, its own state, on that sequence's target."""

from __future__ import annotations

from specdecode.drafters.base import Drafter
from specdecode.drafters.composite import LookupThenModelDrafter
from specdecode.drafters.eagle import EagleDrafter, FeatureModel
from specdecode.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["drafter_for_sequence", "runs_per_sequence"]


def drafter_for_sequence(drafter: Drafter | None, target: FeatureModel) -> Drafter | None:
    """A fresh drafter like `drafter` for a sequence decoded by `target` (a `native.batching.SlotLM`).

    Prompt lookup gets a fresh index, an EAGLE draft shares its network and has a cache of its own on the
    sequence's features. A separate draft model would need a model cache per sequence; that is refused.
    """
    if drafter is None:
        return None
    if isinstance(drafter, PromptLookupDrafter):
        return PromptLookupDrafter(max_ngram=drafter.max_ngram, min_ngram=drafter.min_ngram)
    if isinstance(drafter, EagleDrafter):
        return drafter.on_target(target)
    if isinstance(drafter, LookupThenModelDrafter):
        model = drafter_for_sequence(drafter.model, target)
        return LookupThenModelDrafter(model, min_match=drafter.lookup.min_ngram, max_match=drafter.lookup.max_ngram)
    raise ValueError(f"draft: {drafter.name} cannot run per sequence of a batch (a draft model keeps one cache); "
                     "use 'ngram', an EAGLE draft ('auto', 'bundled'), 'none', or --max-batch 1")


def runs_per_sequence(drafter: Drafter | None) -> bool:
    """Whether `drafter_for_sequence` takes this drafter (no separate draft model)."""
    if isinstance(drafter, LookupThenModelDrafter):
        return runs_per_sequence(drafter.model)
    return drafter is None or isinstance(drafter, (PromptLookupDrafter, EagleDrafter))
