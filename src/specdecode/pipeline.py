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
from specdecode.native.loading import end_of_sequence_ids

__all__ = ["Pipeline", "StopStrings", "DEFAULT_DRAFT", "make_drafter", "resolve_draft_name", "draft_model_part",
           "bundled_draft_runs", "default_gamma"]

DEFAULT_DRAFT = "auto"  # see AUTO_DRAFT
# What 'auto' means: the target's bundled distilled draft (for the default target an EAGLE draft, which
# needs the native engine), with prompt lookup wherever the context repeats, up to five draft tokens per
# target call: prompt lookup proposes five where it finds a match, the EAGLE draft stops after a token it
# gave less than DEFAULT_MIN_CONFIDENCE (1.7 tokens per draft at T=0, 1.25 at T=1). On Spec-Bench on a
# 2-core CPU that is the best measured setting (prompt lookup alone 1.09x / 1.03x at T=0 / T=1;
# docs/benchmarks.md): against two draft tokens every call, 1.37x against 1.31x at T=0 (median over 39
# prompts; mean of the per-category medians 1.47x against 1.36x), and a tie at T=1 (1.24x against 1.28x
# median, 1.23x both as mean of the per-category medians; run 14). A target without a bundled draft that
# can run with it gets prompt lookup alone.
AUTO_DRAFT = "bundled+ngram"
AUTO_DRAFT_WITHOUT_BUNDLED = "ngram"
AUTO_GAMMA = 5  # --gamma when not given with the 'auto' draft: the longest draft
# Drafts that end early (min_confidence > 0) are short (above): the target's layout is timed for calls of at
# most this many tokens with them
EARLY_END_ROWS_PER_CALL = 3
DEFAULT_GAMMA = 4  # --gamma when not given with any other draft
# A draft model ends before gamma tokens after a token its own q gave less than this (EAGLE-2's
# confidence; `drafters.base.unsure`). 0 drafts gamma tokens every call. For a draft cut from the default
# target (c ~ 0.1) at gamma 4 it took Spec-Bench from 0.92x to 1.11x at T=0, 0.88x to 1.10x at T=1
# (docs/benchmarks.md).
DEFAULT_MIN_CONFIDENCE = 0.6


def resolve_draft_name(spec: str, target: str = DEFAULT_TARGET, native: bool = True) -> str:
    """A draft name with 'auto' replaced by what it means today for `target`; other names unchanged.

    native: whether the target runs on an engine an EAGLE draft can read the features of (native, llama.cpp).
    """
    if spec != "auto":
        return spec
    return AUTO_DRAFT if bundled_draft_runs(target, native) else AUTO_DRAFT_WITHOUT_BUNDLED


def bundled_draft_runs(target: str, native: bool) -> bool:
    """Whether `target` has a bundled draft that can run with it (an EAGLE draft needs the native or llama.cpp engine)."""
    path = bundled_draft_dir(target)
    return path is not None and (native or not is_eagle_draft(path))


def draft_model_part(spec: str, target: str = DEFAULT_TARGET, native: bool = True) -> str | None:
    """The draft model a draft name runs: 'auto' resolved, '+ngram' dropped, 'bundled' as the bundled draft's
    directory; None for 'none' and 'ngram', which run no model. native: see resolve_draft_name."""
    if spec == "none":
        return None
    model_spec = resolve_draft_name(spec, target, native).removesuffix("+ngram")
    if model_spec == "ngram":
        return None
    if model_spec == "bundled":
        path = bundled_draft_dir(target)
        if path is None:
            raise ValueError(f"draft: no bundled draft for target {target!r}; use 'ngram' or a model path")
        return str(path)
    return model_spec


def verification_rows(draft: str | None, gamma: int, min_confidence: float, target: str = DEFAULT_TARGET,
                      native: bool = True) -> int:
    """The tokens most target calls will feed with `draft` (what packing='auto' times the target's layout for).

    1 without a draft; gamma + 1 with one, but at most EARLY_END_ROWS_PER_CALL with a draft model that ends
    early (min_confidence > 0). native: whether the target runs on the native engine (see resolve_draft_name).
    """
    if draft is None or draft == "none":
        return 1
    if min_confidence > 0 and draft_model_part(draft, target, native) is not None:
        return min(gamma + 1, EARLY_END_ROWS_PER_CALL)
    return gamma + 1


def default_gamma(draft: str | None) -> int:
    """The gamma used when none is given: AUTO_GAMMA for the 'auto' draft, DEFAULT_GAMMA otherwise."""
    return AUTO_GAMMA if draft == "auto" else DEFAULT_GAMMA


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
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE) -> Drafter | None:
    """A drafter from its CLI name.

    'auto' (default): AUTO_DRAFT, 'bundled+ngram' (or 'ngram' when the target has no bundled draft, or when the
    bundled draft is an EAGLE draft and the target does not run on the native engine);
    'ngram': prompt lookup; 'none': the target alone; 'bundled': the distilled draft shipped for the target;
    a path or id: a draft model (a `specdecode distill` output directory, a GGUF file or an HF model; an
    EAGLE draft from `specdecode distill --eagle` needs the target on the native engine);
    'X+ngram': draft X, but prompt lookup wherever the context repeats (a match of >= 3 tokens).
    min_confidence: a draft model's early end (`drafters.base.unsure`); prompt lookup has no such setting.
    """
    if spec is None or spec == "none":
        return None
    # 'auto' runs the bundled EAGLE draft on the native engine only: on llama.cpp its features make every prompt
    # token an output, and on a 2-core Xeon it ran at 0.95x the target alone (median of 107 Spec-Bench prompts, 0.37x
    # on a long one; docs/llamacpp-engine.md). Asked for by name it runs on any engine that keeps features
    native = isinstance(target.model, NativeLM)
    spec = resolve_draft_name(spec, target.source, native)
    model_spec = draft_model_part(spec, target.source, native)
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
        draft = backends.load(model_spec, backend)
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
        min_confidence: float = DEFAULT_MIN_CONFIDENCE, threads: int | None = None, cost_aware: bool | None = None,
    ) -> "Pipeline":
        """Load target and draft on `backend` (`backends.load`; 'auto': a GGUF file on the faster of llama.cpp and
        the native engine here, other models native where supported, else HF).

        gamma None: default_gamma(draft). packing: the native target's layout of its linear layers
        (`specdecode.native.fast`); 'auto' picks the layout that runs rows_per_call tokens per target
        call fastest on this machine (`NativeLM`). rows_per_call None: `verification_rows`.
        min_confidence: a draft model's early end (`drafters.base.unsure`). threads: llama.cpp's threads.
        cost_aware: choose each call's draft length from the target's measured costs (timed once per machine,
        `cost_profile`); None: for the 'auto' draft without an explicit gamma.
        """
        if cost_aware is None:
            cost_aware = draft == DEFAULT_DRAFT and gamma is None
        gamma = default_gamma(draft) if gamma is None else check_gamma(gamma)  # before the (slow) load
        check_min_confidence(min_confidence)
        if rows_per_call is None:
            rows_per_call = verification_rows(draft, gamma, min_confidence, target, native=backend != "hf")
        loaded = backends.load(target, backend, packing, rows_per_call, threads=threads)
        if loaded.tokenizer is None:
            raise ValueError(f"target: {target} has no tokenizer, so it cannot take text prompts")
        drafter = make_drafter(draft, loaded, backend, min_confidence)
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
    ) -> TokenStream:
        """Decode prompt_ids; speculative=False runs the target alone (the baseline). seed None: a fresh random seed."""
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
            draft_length=self.draft_length() if speculative else None,
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
