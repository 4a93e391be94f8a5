"""Drafters: swappable sources of draft tokens."""

from specdecode.drafters.base import Draft, Drafter
from specdecode.drafters.composite import LookupThenModelDrafter
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.model import ModelDrafter
from specdecode.drafters.prompt_lookup import PromptLookupDrafter
from specdecode.drafters.statistical import BigramDrafter, UnigramDrafter

__all__ = [
    "Draft",
    "Drafter",
    "ModelDrafter",
    "EagleDrafter",
    "PromptLookupDrafter",
    "LookupThenModelDrafter",
    "UnigramDrafter",
    "BigramDrafter",
]
