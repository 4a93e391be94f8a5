"""What `--draft auto` means for each target, as data: its default draft, γ and early end, per engine.

A target with no entry, or on an engine its entry does not list, gets prompt lookup (`FALLBACK`). Draft
names are those `pipeline.make_drafter` takes: 'bundled' (the distilled draft shipped for the target),
a model name or path, '+ngram' for prompt lookup first wherever the context repeats. The draft's
tokenizer is checked against the target's when it is loaded (`models.compat.check_vocabularies`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DraftDefaults", "PAIRS", "FALLBACK", "ENGINES", "DEFAULT_MIN_CONFIDENCE", "auto_draft"]

ENGINES = ("native", "llamacpp", "hf")

# A draft model ends before γ tokens after a token its own q gave less than this (EAGLE-2's confidence;
# `drafters.base.unsure`). 0 drafts γ every call. For a draft cut from the default target (c ~ 0.1) at γ 4
# it took Spec-Bench from 0.92x to 1.11x at T=0, 0.88x to 1.10x at T=1 (docs/benchmarks.md).
DEFAULT_MIN_CONFIDENCE = 0.6


@dataclass(frozen=True)
class DraftDefaults:
    """A target's 'auto' draft on some engines: the draft, the most draft tokens per call, its early end."""

    draft: str
    gamma: int = 5
    min_confidence: float = DEFAULT_MIN_CONFIDENCE
    engines: tuple[str, ...] = ENGINES  # where this draft pays; elsewhere the next entry, or FALLBACK
    draft_backend: str | None = None  # the draft model's engine (`backends.load`); None: the target's backend

    def __post_init__(self) -> None:
        unknown = set(self.engines) - set(ENGINES)
        if unknown:
            raise ValueError(f"engines must be among {ENGINES}, got {sorted(unknown)}")


FALLBACK = DraftDefaults("ngram")  # prompt lookup: runs with any target on any engine

PAIRS: dict[str, tuple[DraftDefaults, ...]] = {
    # The bundled EAGLE draft reads the native engine's features, with prompt lookup on repeats: on Spec-Bench
    # on a 2-core CPU 1.37x at T=0 against 1.31x for two draft tokens every call (docs/benchmarks.md). On
    # llama.cpp it ran at 0.95x the target alone (its features make every prompt token an output;
    # docs/llamacpp-engine.md), and it needs the features transformers does not give: prompt lookup there.
    "smollm2-135m-instruct": (DraftDefaults("bundled+ngram", engines=("native",)),),
    # The paper's setting: the family's 0.5B drafts for the 1.5B (the same tokenizer), on its fastest engine
    # ('auto': llama.cpp's Q4_K_M kernels; 0.65 of the 1.5B's llama.cpp step, 44 ms a token, in docs/benchmarks/qwen-pair/).
    # Cost-aware draft lengths decide per engine whether it pays: on the native engine (memory-bound) it does;
    # on llama.cpp's CPU kernels, where verifying k tokens costs about 0.4 k single ones more and the 0.5B
    # costs 0.6 of the 1.5B, only prompt lookup does (docs/benchmarks/qwen-pair/).
    "qwen2.5-coder-1.5b-instruct": (
        DraftDefaults("qwen2.5-coder-0.5b-instruct+ngram", gamma=5, draft_backend="auto"),
    ),
}


def auto_draft(target: str, engine: str) -> DraftDefaults:
    """What 'auto' means for `target` on `engine` ('native', 'llamacpp' or 'hf')."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return next((entry for entry in PAIRS.get(str(target), ()) if engine in entry.engines), FALLBACK)
