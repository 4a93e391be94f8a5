"""Models behind the `LanguageModel` protocol, and how to load them.

The Hugging Face adapters load on first use: importing transformers' modeling code takes
seconds, and the native engine's path (`specdecode generate` on the default model) never needs it.
"""

from specdecode.models.base import ContextLengthError, LanguageModel
from specdecode.models.compat import IncompatibleVocabularyError, check_vocabularies

__all__ = [
    "ContextLengthError",
    "LanguageModel",
    "IncompatibleVocabularyError",
    "check_vocabularies",
    "HFCausalLM",
    "HFSeq2SeqLM",
    "wrap_hf_model",
]

_HF_NAMES = ("HFCausalLM", "HFSeq2SeqLM", "wrap_hf_model")


def __getattr__(name: str):
    if name in _HF_NAMES:
        from specdecode.models import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
