"""Models behind the `LanguageModel` protocol, and how to load them."""

from specdecode.models.base import ContextLengthError, LanguageModel
from specdecode.models.compat import IncompatibleVocabularyError, check_vocabularies
from specdecode.models.hf import HFCausalLM, HFSeq2SeqLM, wrap_hf_model

__all__ = [
    "ContextLengthError",
    "LanguageModel",
    "IncompatibleVocabularyError",
    "check_vocabularies",
    "HFCausalLM",
    "HFSeq2SeqLM",
    "wrap_hf_model",
]
