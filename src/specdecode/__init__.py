"""specdecode: exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023).

    >>> from specdecode import Pipeline, SamplingParams
    >>> pipe = Pipeline.load()                      # SmolLM2-135M-Instruct, bundled EAGLE draft + prompt lookup
    >>> ids = pipe.encode("Name three colours.")
    >>> result = pipe.generate(ids, max_new_tokens=32, sampling=SamplingParams(0.0))
    >>> pipe.text(result.token_ids), result.stats.mean_accepted
"""

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import GenerationResult, GenerationStats, TokenStream, generate, stream
from specdecode.drafters import BigramDrafter, Draft, Drafter, ModelDrafter, PromptLookupDrafter, UnigramDrafter
from specdecode.models import LanguageModel, check_vocabularies
from specdecode.models.loading import load_model
from specdecode.pipeline import Pipeline

__version__ = "0.1.0"

__all__ = [
    "SamplingParams",
    "GenerationResult",
    "GenerationStats",
    "TokenStream",
    "generate",
    "stream",
    "Draft",
    "Drafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "UnigramDrafter",
    "BigramDrafter",
    "LanguageModel",
    "check_vocabularies",
    "wrap_hf_model",
    "load_model",
    "Pipeline",
]


def __getattr__(name: str):
    if name == "wrap_hf_model":  # imports transformers' modeling code (seconds): only on first use
        from specdecode.models.hf import wrap_hf_model

        return wrap_hf_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
