"""specdecode's own methods: the target alone and speculative decoding with each drafter.

Model drafts and prompt lookup come from `pipeline.make_drafter`; the unigram and bigram drafters
(the paper's Table 3 baselines) are fitted leave-one-out on the target's own greedy outputs for
the *other* benchmark prompts, so no drafter ever sees the prompt it is evaluated on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdecode.bench.measure import Method, Output, timed
from specdecode.core.sampling import SamplingParams
from specdecode.drafters import BigramDrafter, Drafter, UnigramDrafter
from specdecode.pipeline import Pipeline

__all__ = ["target_alone", "speculative", "LeaveOneOut", "FIT_CORPUS", "model_of"]

FIT_CORPUS = (
    "unigram and bigram drafters are fitted, for each prompt, on the target's own greedy outputs "
    "for the other benchmark prompts (leave-one-out), never on the evaluated prompt or its output"
)


def _generate(pipeline: Pipeline, encoded: Sequence[torch.Tensor], max_new_tokens: int, speculative: bool):
    def generate(prompt: int, temperature: float, seed: int, limit: int | None = None) -> Output:
        def run():
            result = pipeline.generate(
                encoded[prompt], max_new_tokens=limit or max_new_tokens, sampling=SamplingParams(temperature),
                seed=seed, speculative=speculative,
            )
            return result.token_ids, result.finish_reason, result.stats.to_dict()

        return timed(run)

    return generate


def target_alone(pipeline: Pipeline, encoded: Sequence[torch.Tensor], max_new_tokens: int) -> Method:
    """Plain autoregressive decoding of the target on specdecode's engine: the baseline of every specdecode method."""
    return Method("target alone", "specdecode", "baseline", None, None, _generate(pipeline, encoded, max_new_tokens, False))


def speculative(
    name: str,
    pipeline: Pipeline,
    drafter_for: Callable[[int], Drafter],
    gamma: int,
    encoded: Sequence[torch.Tensor],
    max_new_tokens: int,
) -> Method:
    """Speculative decoding with drafter_for(prompt index) proposing gamma tokens per target call."""
    def generate(prompt: int, temperature: float, seed: int, limit: int | None = None) -> Output:
        spec = Pipeline(pipeline.target, drafter_for(prompt), gamma)
        return _generate(spec, encoded, max_new_tokens, True)(prompt, temperature, seed, limit)

    return Method(f"{name} γ={gamma}", "specdecode", "specdecode", name, gamma, generate)


class LeaveOneOut:
    """drafter(prompt i) = a unigram or bigram drafter fitted on corpus[j] for every j != i (cached)."""

    def __init__(self, kind: str, corpus: Sequence[Sequence[int]], vocab_size: int) -> None:
        if kind not in ("unigram", "bigram"):
            raise ValueError(f"kind must be 'unigram' or 'bigram', got {kind!r}")
        self.kind = kind
        self.corpus = [list(c) for c in corpus]
        self.vocab_size = vocab_size
        self._cache: dict[int, Drafter] = {}

    def __call__(self, prompt: int) -> Drafter:
        if prompt not in self._cache:
            others = [seq for j, seq in enumerate(self.corpus) if j != prompt]
            cls = UnigramDrafter if self.kind == "unigram" else BigramDrafter
            self._cache[prompt] = cls.fit(others, self.vocab_size)
        return self._cache[prompt]


def model_of(drafter: Drafter | None):
    """The draft's LanguageModel when the drafter runs one (ModelDrafter, or a drafter wrapping one), else None."""
    model = getattr(drafter, "model", None)
    if all(hasattr(model, a) for a in ("prefill", "extend", "rollback")):
        return model
    return model_of(model) if hasattr(model, "propose") else None  # a drafter around a model drafter
