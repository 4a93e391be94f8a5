"""Text in, text out: tokenizer, chat template, stop strings and drafter choice around the decoding loop."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdecode.core.draft_length import AdaptiveDraftLength, CostProfile
from specdecode.core.sampling import SamplingParams
from specdecode.cost_profile import measure_cost_profile, measure_draft_costs
from specdecode.decoding import GenerationResult, TokenStream, check_gamma, stream
from specdecode.drafters import Drafter, LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from specdecode.drafters.distilled import bundled_draft_dir, is_distilled_draft, load_distilled, saved_tokenizer
from specdecode.drafters.base import check_min_confidence
from specdecode.drafters.eagle import EagleDrafter, is_eagle_draft, keeps_features, load_eagle
from specdecode.llamacpp.engine import LlamaCppLM
from specdecode.native.engine import NativeLM
from specdecode.native.quant import int8_kernel_available
from specdecode.models.compat import check_vocabularies
from specdecode import backends
from specdecode.models.loading import DEFAULT_TARGET, LoadedModel
from specdecode.pairs import DEFAULT_MIN_CONFIDENCE, DraftDefaults, auto_draft
from specdecode.native.loading import end_of_sequence_ids

__all__ = ["Pipeline", "StopStrings", "DEFAULT_DRAFT", "DEFAULT_GAMMA", "make_drafter", "resolve_draft_name",
           "draft_model_part", "default_gamma", "auto_entry", "engine_name", "expected_engine"]

DEFAULT_DRAFT = "auto"  # the target's entry in `pairs.PAIRS` for the engine it runs on, with cost-aware draft lengths
DEFAULT_GAMMA = 4  # --gamma when not given with a draft other than 'auto' (whose gamma is its entry's)
# Drafts that end early (min_confidence > 0) are short (the bundled EAGLE draft: 1.7 tokens at T=0, 1.25 at T=1):
# the target's layout is timed for calls of at most this many tokens with them
EARLY_END_ROWS_PER_CALL = 3


def engine_name(model) -> str:
    """'native', 'llamacpp' or 'hf': the engine a loaded target runs on (the engines `pairs.PAIRS` names)."""
    return "native" if isinstance(model, NativeLM) else "llamacpp" if isinstance(model, LlamaCppLM) else "hf"


def expected_engine(backend: str) -> str:
    """The engine a backend name loads a model on, as far as is known before the load ('auto' counts as native:
    the draft study's engine, and the one a target's layout is timed for)."""
    return backend if backend in ("llamacpp", "hf") else "native"


def auto_entry(draft: str | None, target: str = DEFAULT_TARGET, engine: str = "native") -> DraftDefaults | None:
    """The target's entry in `pairs.PAIRS` on `engine` when the draft is 'auto' (its draft, gamma, early end and
    draft engine are the defaults then); None for any other draft, which takes the global defaults."""
    return auto_draft(target, engine) if draft == DEFAULT_DRAFT else None


def resolve_draft_name(spec: str, target: str = DEFAULT_TARGET, engine: str = "native") -> str:
    """A draft name with 'auto' replaced by the target's draft on `engine` (`pairs.auto_draft`); others unchanged."""
    entry = auto_entry(spec, target, engine)
    return spec if entry is None else entry.draft


def default_gamma(draft: str | None, target: str = DEFAULT_TARGET, engine: str = "native") -> int:
    """The gamma used when none is given: the pair's for 'auto', DEFAULT_GAMMA otherwise."""
    entry = auto_entry(draft, target, engine)
    return DEFAULT_GAMMA if entry is None else entry.gamma


def _default_min_confidence(draft: str | None, target: str, engine: str) -> float:
    entry = auto_entry(draft, target, engine)
    return DEFAULT_MIN_CONFIDENCE if entry is None else entry.min_confidence


def draft_model_part(spec: str, target: str = DEFAULT_TARGET, engine: str = "native") -> str | None:
    """The draft model a draft name runs: 'auto' resolved, '+ngram' dropped, 'bundled' as the bundled draft's
    directory; None for 'none' and 'ngram', which run no model."""
    if spec == "none":
        return None
    model_spec = resolve_draft_name(spec, target, engine).removesuffix("+ngram")
    if model_spec == "ngram":
        return None
    if model_spec == "bundled":
        path = bundled_draft_dir(target)
        if path is None:
            raise ValueError(f"draft: no bundled draft for target {target!r}; use 'ngram' or a model path")
        return str(path)
    return model_spec


def verification_rows(draft: str | None, gamma: int, min_confidence: float, target: str = DEFAULT_TARGET,
                      engine: str = "native") -> int:
    """The tokens most target calls will feed with `draft` (what packing='auto' times the target's layout for).

    1 without a draft; gamma + 1 with one, but at most EARLY_END_ROWS_PER_CALL with a draft model that ends
    early (min_confidence > 0).
    """
    if draft is None or draft == "none":
        return 1
    if min_confidence > 0 and draft_model_part(draft, target, engine) is not None:
        return min(gamma + 1, EARLY_END_ROWS_PER_CALL)
    return gamma + 1


def _stop_list(stop: str | Sequence[str]) -> Sequence[str]:
    """Stop strings as a sequence: one string (as OpenAI's `stop` may be) is one stop string, not its characters."""
    return [stop] if isinstance(stop, str) else stop


class StopStrings:
    """Stop condition for the decoding loop: end once the decoded text contains any of `stops` (`_stop_list`)."""

    def __init__(self, tokenizer, stops: str | Sequence[str]) -> None:
        stops = _stop_list(stops)
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stops)!r}")
        self.tokenizer = tokenizer
        self.stops = list(stops)

    def _hit(self, ids: Sequence[int]) -> bool:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return any(s in text for s in self.stops)

    def __call__(self, ids: Sequence[int]) -> int | None:
        """The fewest leading tokens whose text contains a stop string, or None."""
        if not self._hit(ids):
            return None
        keep = len(ids)
        while keep > 1 and self._hit(ids[: keep - 1]):
            keep -= 1
        return keep

    def trim(self, text: str) -> str:
        """Cut the text before the earliest stop string."""
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=len(text))
        return text[:cut]


def make_drafter(spec: str | None, target: LoadedModel, backend: str = "auto",
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE, dtype: str = "float32") -> Drafter | None:
    """A drafter from its CLI name.

    'auto' (default): the target's draft on its engine (`pairs.PAIRS`; prompt lookup for a target without one);
    'ngram': prompt lookup; 'none': the target alone; 'bundled': the distilled draft shipped for the target;
    a name or path: a draft model (a known model's name, a `specdecode distill` output directory, a GGUF file or
    an HF model; an EAGLE draft from `specdecode distill --eagle` needs the target on the native or llama.cpp
    engine); 'X+ngram': draft X, but prompt lookup wherever the context repeats (a match of >= 3 tokens).
    min_confidence: a draft model's early end (`drafters.base.unsure`); prompt lookup has no such setting.
    dtype: a draft model's weights where it runs on the native engine or transformers.
    """
    if spec is None or spec == "none":
        return None
    engine = engine_name(target.model)
    spec = resolve_draft_name(spec, target.source, engine)
    model_spec = draft_model_part(spec, target.source, engine)
    if model_spec is None:
        return PromptLookupDrafter()
    with_lookup = spec.endswith("+ngram")
    if is_eagle_draft(model_spec):
        drafter = eagle_drafter(model_spec, target, min_confidence)
        return LookupThenModelDrafter(drafter) if with_lookup else drafter
    if is_distilled_draft(model_spec):
        draft = load_distilled(model_spec)  # always the native engine
    elif isinstance(target.model, LlamaCppLM) and backends.is_gguf(model_spec):  # a GGUF draft on the target's engine
        draft = backends.load(model_spec, "llamacpp", threads=target.model.threads)
    else:
        draft = backends.load(model_spec, backend, dtype="float32" if backend == "llamacpp" else dtype)
    check_vocabularies(target.tokenizer, draft.tokenizer, target.model.vocab_size, draft.model.vocab_size)
    drafter = ModelDrafter(draft.model, min_confidence)
    return LookupThenModelDrafter(drafter) if with_lookup else drafter


def eagle_drafter(directory: str, target: LoadedModel, min_confidence: float = DEFAULT_MIN_CONFIDENCE) -> EagleDrafter:
    """The EAGLE draft in `directory` on `target`'s features, its tokenizer checked against the target's.

    On a CPU with torch's int8 kernel it drafts on int8 weights (see EagleDrafter's quantize).
    """
    if not keeps_features(target.model):
        raise ValueError(f"draft: {directory} is an EAGLE draft, which reads the target's features; "
                         "it needs the target on the native or the llama.cpp engine (--backend native, llamacpp or auto)")
    network, output_ids, _ = load_eagle(directory)
    tokenizer = saved_tokenizer(Path(directory))
    check_vocabularies(target.tokenizer, tokenizer, target.model.vocab_size, network.config.vocab_size)
    # int8 where torch's int8 CPU kernel runs: half the draft's time, the same alpha (docs/distill.md)
    quantize = "int8" if target.model.device.type == "cpu" and int8_kernel_available() else "none"
    return EagleDrafter(network, output_ids, target.model, name=Path(directory).name, quantize=quantize,
                        min_confidence=min_confidence)


@dataclass
class Pipeline:
    """A target with its tokenizer and a drafter: what `specdecode generate` runs.

    costs: the target's measured verification costs; when set, each call drafts the length that pays
    most by Thm 3.8 (at most gamma, 0 where none pays; `core.draft_length`), else gamma every call.
    """

    target: LoadedModel
    drafter: Drafter | None
    gamma: int = 4
    costs: CostProfile | None = None
    draft_costs: dict[str, float] = field(default_factory=dict)  # c of the drafter's model sources

    @classmethod
    def load(
        cls, target: str = DEFAULT_TARGET, draft: str | None = DEFAULT_DRAFT, gamma: int | None = None,
        backend: str = "auto", packing: str = "auto", rows_per_call: int | None = None,
        min_confidence: float | None = None, threads: int | None = None, cost_aware: bool | None = None,
        dtype: str = "float32", draft_backend: str | None = None,
    ) -> "Pipeline":
        """Load target and draft on `backend` (`backends.load`; 'auto': a GGUF file on the faster of llama.cpp and
        the native engine here, other models native where supported, else HF).

        gamma, min_confidence None: the target's entry in `pairs.PAIRS` for the 'auto' draft on the engine the
        target loads on, else DEFAULT_GAMMA and DEFAULT_MIN_CONFIDENCE. packing: the native target's layout
        of its linear layers (`specdecode.native.fast`); 'auto' picks the layout that runs rows_per_call tokens
        per target call fastest on this machine (`NativeLM`). rows_per_call None: `verification_rows`.
        min_confidence: a draft model's early end (`drafters.base.unsure`). threads: llama.cpp's threads.
        dtype: the weights of target and draft on the native engine and transformers ('float32', 'bfloat16').
        draft_backend: the engine of a draft model (None: the pair's for 'auto', else `backend`; a GGUF draft of a
        llama.cpp target runs there too).
        cost_aware: choose each call's draft length from the target's measured costs (timed once per machine,
        `cost_profile`); None: for the 'auto' draft without an explicit gamma.
        """
        if gamma is not None:  # checked before the (slow) load
            check_gamma(gamma)
        if min_confidence is not None:
            check_min_confidence(min_confidence)
        if rows_per_call is None:  # for the native engine's layout: the pair's defaults there
            expected = expected_engine(backend)
            rows_per_call = verification_rows(
                draft, gamma or default_gamma(draft, target, expected),
                _default_min_confidence(draft, target, expected) if min_confidence is None else min_confidence,
                target, expected)
        loaded = backends.load(target, backend, packing, rows_per_call, threads=threads, dtype=dtype)
        if draft_backend is None:
            entry = auto_entry(draft, target, engine_name(loaded.model))
            draft_backend = entry.draft_backend if entry is not None and entry.draft_backend else backend
        return cls.around(loaded, draft, gamma, draft_backend, min_confidence, cost_aware, dtype)

    @classmethod
    def around(
        cls, loaded: LoadedModel, draft: str | None = DEFAULT_DRAFT, gamma: int | None = None,
        draft_backend: str = "auto", min_confidence: float | None = None, cost_aware: bool | None = None,
        dtype: str = "float32",
    ) -> "Pipeline":
        """A pipeline around an already loaded target (several pipelines may share one); the options as in `load`."""
        if cost_aware is None:
            cost_aware = draft == DEFAULT_DRAFT and gamma is None
        if loaded.tokenizer is None:
            raise ValueError(f"target: {loaded.source} has no tokenizer, so it cannot take text prompts")
        engine = engine_name(loaded.model)
        gamma = default_gamma(draft, loaded.source, engine) if gamma is None else check_gamma(gamma)
        if min_confidence is None:
            min_confidence = _default_min_confidence(draft, loaded.source, engine)
        drafter = make_drafter(draft, loaded, draft_backend, min_confidence, dtype)
        if not cost_aware or drafter is None:
            return cls(loaded, drafter, gamma)
        costs = measure_cost_profile(loaded.model, gamma + 1)
        return cls(loaded, drafter, gamma, costs, measure_draft_costs(loaded.model, drafter, costs, gamma))

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def eos_token_ids(self) -> set[int]:
        return end_of_sequence_ids(self.target.hf_model, self.tokenizer)

    def encode(self, prompt: str, chat: bool | None = None) -> torch.Tensor:
        """Token ids [P] of the prompt; chat=None applies the chat template when the tokenizer has one."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        use_chat = bool(self.tokenizer.chat_template) if chat is None else chat
        if use_chat:
            if not self.tokenizer.chat_template:
                raise ValueError(f"chat: the tokenizer of {self.target.source} has no chat template; use --no-chat")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        else:
            ids = self.tokenizer(prompt)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def stream(
        self,
        prompt_ids: torch.Tensor,
        *,
        max_new_tokens: int = 128,
        sampling: SamplingParams = SamplingParams(),
        stop: str | Sequence[str] = (),
        seed: int | None = 0,
        speculative: bool = True,
        draft_length: AdaptiveDraftLength | None = None,
    ) -> TokenStream:
        """Decode prompt_ids; speculative=False runs the target alone (the baseline). seed None: a fresh random seed.
        draft_length: the cost-aware draft length to use (None: a fresh one from the costs, `draft_length()`)."""
        generator = torch.Generator()
        if seed is None:
            generator.seed()  # a non-deterministic seed (a new generator always starts from the same one)
        else:
            generator.manual_seed(seed)
        return stream(
            self.target.model,
            prompt_ids,
            drafter=self.drafter if speculative else None,
            gamma=self.gamma,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_token_ids=self.eos_token_ids(),
            stop=StopStrings(self.tokenizer, stop) if stop else None,
            generator=generator,
            draft_length=None if not speculative else self.draft_length() if draft_length is None else draft_length,
        )

    def draft_length(self) -> AdaptiveDraftLength | None:
        """A fresh cost-aware draft length for one generation (None: gamma every call)."""
        if self.costs is None or self.drafter is None:
            return None
        return AdaptiveDraftLength(self.costs, self.gamma, self.draft_costs)

    def text(self, token_ids: Sequence[int], stop: str | Sequence[str] = ()) -> str:
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return StopStrings(self.tokenizer, stop).trim(text) if stop else text

    def generate(self, prompt_ids: torch.Tensor, **kwargs) -> GenerationResult:
        return self.stream(prompt_ids, **kwargs).run()


def incremental_text(pipeline: Pipeline, chunks: Iterator[list[int]], stop: str | Sequence[str] = ()) -> Iterator[str]:
    """Turn streamed token chunks into text pieces, holding back incomplete characters and possible stop-string prefixes."""
    stop = _stop_list(stop)
    ids: list[int] = []
    shown = 0
    hold = max((len(s) for s in stop), default=1) - 1
    for chunk in chunks:
        ids.extend(chunk)
        text = pipeline.text(ids, stop)
        safe = len(text) - hold
        while safe > shown and text[safe - 1] == "\ufffd":  # an unfinished multi-byte character
            safe -= 1
        if safe > shown:
            yield text[shown:safe]
            shown = safe
    text = pipeline.text(ids, stop)
    if len(text) > shown:
        yield text[shown:]
