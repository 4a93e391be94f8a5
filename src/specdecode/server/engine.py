"""The model side of the server: prompt encoding, drafter choice, and running a job on its model thread.

With max_batch > 1 (the native engine) each running job decodes one sequence of a `BatchedNativeLM`, with a
drafter of its own (`drafters.per_sequence`) and draft lengths priced at its share of a batched pass
(`core.batch_costs`); the jobs' forward passes run together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from specdecode.core.batch_costs import PassCosts, SharedPassDraftLength
from specdecode.core.draft_length import AdaptiveDraftLength
from specdecode.core.sampling import SamplingParams
from specdecode.cost_profile import measure_pass_costs
from specdecode.decoding import TokenStream
from specdecode.drafters import Drafter, LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.per_sequence import drafter_for_sequence
from specdecode.models.loading import LoadedModel
from specdecode.native.batching import BatchedNativeLM
from specdecode.native.engine import NativeLM
from specdecode.pipeline import Pipeline, incremental_text
from specdecode.server.errors import APIError
from specdecode.server.worker import Delta, Finished, Job

__all__ = ["GenerationRequest", "Engine", "finish_reason"]

NO_DRAFT = "none"
MAX_PASS_ROWS = 256  # the largest pass timed for the batch's draft lengths (beyond: extrapolated)


@dataclass(frozen=True)
class GenerationRequest:
    """Everything the model thread needs for one generation (validated already)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    seed: int
    draft: str  # canonical drafter name: a key of Engine.drafters
    gamma: int | None  # draft tokens every call; None: the server's (cost-aware draft lengths where it chose them)
    min_confidence: float | None = None  # the draft model's early end for this request; None: the server's
    seeded: bool = False  # the client chose the seed: in a batch, its draft lengths then follow its own calls only


def finish_reason(reason: str) -> str:
    """Our finish reasons in OpenAI's words: eos/stop -> 'stop', length/context -> 'length'."""
    return "stop" if reason in ("eos", "stop") else "length"


class Engine:
    """A `Pipeline` served over HTTP: one target, the configured drafter, and the per-request alternatives.

    max_batch: sequences decoded together (> 1 needs the target on the native engine: `native.batching`).
    """

    def __init__(self, pipeline: Pipeline, *, model_id: str | None = None, draft_aliases: Iterable[str] = (),
                 max_batch: int = 1, on_pass: Callable[[int, int], None] | None = None) -> None:
        if pipeline.tokenizer is None:
            raise ValueError("the target has no tokenizer, so it cannot serve text requests")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.pipeline = pipeline
        self.model_id = model_id or str(pipeline.target.source)
        configured = pipeline.drafter
        self.default_draft = configured.name if configured is not None else NO_DRAFT
        ngram = configured if isinstance(configured, PromptLookupDrafter) else PromptLookupDrafter()
        self.drafters: dict[str, Drafter | None] = {NO_DRAFT: None, ngram.name: ngram, self.default_draft: configured}
        self._aliases = {"ngram": ngram.name, "default": self.default_draft}
        self._aliases.update({alias: self.default_draft for alias in draft_aliases if alias})
        # each drafter's early-end threshold as configured (None: no draft model); a request may set its own
        self._min_confidence = {name: None if (model := _model_part(d)) is None else model.min_confidence
                                for name, d in self.drafters.items()}
        self.max_batch = max_batch
        self.batch: BatchedNativeLM | None = None
        self.pass_costs: PassCosts | None = None
        if max_batch > 1:
            self._start_batch(on_pass)

    def _start_batch(self, on_pass: Callable[[int, int], None] | None) -> None:
        """The batched engine on the target's model; every drafter checked to run per sequence; pass costs timed."""
        native = self.pipeline.target.model
        if not isinstance(native, NativeLM):
            raise ValueError(f"max_batch: batching needs the target on the native engine (--backend native), "
                             f"not {type(native).__name__}; use --max-batch 1")
        self.batch = BatchedNativeLM(native.model, self.max_batch, native.max_length, name=native.name, on_pass=on_pass)
        with self.batch.open() as sequence:  # refuse a drafter that cannot run per sequence now, not per request
            for drafter in self.drafters.values():
                drafter_for_sequence(drafter, sequence)
        if self.pipeline.costs is not None:
            # at a full batch few sequences draft (a row costs about a sequence's share): beyond 2 rows per
            # sequence, P(R) is extrapolated
            rows = min(MAX_PASS_ROWS, 2 * self.max_batch, self.max_batch * (self.pipeline.gamma + 1))
            self.pass_costs = measure_pass_costs(self.batch, native, rows)

    @property
    def tokenizer(self):
        return self.pipeline.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.pipeline.target.model.vocab_size

    @property
    def context_length(self) -> int:
        return self.pipeline.target.model.max_length

    def min_confidence(self, draft: str) -> float | None:
        """The server's early-end threshold of drafter `draft` (a key of drafters), None if it has no draft model."""
        return self._min_confidence[draft]

    def draft_names(self) -> list[str]:
        return sorted(set(self.drafters) | set(self._aliases))

    def resolve_draft(self, name: str | None) -> str:
        """The canonical drafter name for a request's `draft` (None: the server's configured draft)."""
        if name is None:
            return self.default_draft
        name = self._aliases.get(name, name)
        if name not in self.drafters:
            raise APIError(
                400, f"draft: unknown draft {name!r}; choose one of {', '.join(self.draft_names())}",
                param="draft", code="invalid_value",
            )
        return name

    # -- prompts (event loop thread; tokenizers are thread-safe for encoding)
    def encode_prompt(self, prompt: str | Sequence[str] | Sequence[int]) -> list[int]:
        """Token ids of a completion prompt: text without chat template, or token ids as given."""
        if isinstance(prompt, list) and not prompt:
            raise APIError(400, "prompt: the prompt must not be empty", param="prompt", code="invalid_value")
        if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise APIError(400, f"prompt: token ids must lie in [0, {self.vocab_size}), got {bad[0]}",
                               param="prompt", code="invalid_value")
            return list(prompt)
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: only one prompt per request is supported, got {len(prompt)}",
                               param="prompt", code="unsupported_value")
            prompt = prompt[0]
        ids = self.tokenizer(prompt)["input_ids"] if prompt else []
        if not ids:
            raise APIError(400, "prompt: the prompt must not be empty", param="prompt", code="invalid_value")
        return list(ids)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation through the tokenizer's chat template, ready for the assistant's turn."""
        if not self.tokenizer.chat_template:
            raise APIError(400, f"messages: the tokenizer of {self.model_id} has no chat template; use /v1/completions",
                           param="messages", code="no_chat_template")
        try:
            encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        except Exception as error:  # template errors (e.g. roles that must alternate) are the request's fault
            raise APIError(400, f"messages: the chat template rejected the messages: {error}",
                           param="messages", code="invalid_value") from error
        return list(encoded["input_ids"])

    # -- generation (model threads only)
    def run(self, job: Job) -> None:
        """Generate for `job`, emitting text deltas and then `Finished` (or stopping when it is cancelled)."""
        if self.batch is not None:
            self._run_in_batch(job)
            return
        request: GenerationRequest = job.request  # type: ignore[assignment]
        drafter = self.drafters[request.draft]
        model = _model_part(drafter)
        if model is not None and request.min_confidence is not None:  # this request's, then the server's again
            model.min_confidence = request.min_confidence
        try:
            pipe = self._pipeline_for(request, self.pipeline.target, drafter)
            self._generate(job, pipe, pipe.draft_length())
        finally:
            if model is not None:
                model.min_confidence = self._min_confidence[request.draft]

    def _run_in_batch(self, job: Job) -> None:
        """Generate for `job` as one sequence of the batch, with a drafter of its own."""
        request: GenerationRequest = job.request  # type: ignore[assignment]
        assert self.batch is not None
        with self.batch.open() as sequence:
            drafter = drafter_for_sequence(self.drafters[request.draft], sequence)
            model = _model_part(drafter)
            if model is not None and request.min_confidence is not None:
                model.min_confidence = request.min_confidence
            pipe = self._pipeline_for(request, replace(self.pipeline.target, model=sequence), drafter)
            draft_length = pipe.draft_length()
            # priced at its share of a pass; a seeded sample keeps draft lengths (and with them its random draws)
            # that do not depend on the other requests in the batch
            if draft_length is not None and self.pass_costs is not None and (request.sampling.greedy or not request.seeded):
                draft_length = SharedPassDraftLength(
                    draft_length.profile, draft_length.max_gamma, dict(draft_length.draft_costs),
                    costs=self.pass_costs, batch_state=lambda: self.batch.batch_state(sequence),
                    single_t1=draft_length.profile.target_seconds[1])
            self._generate(job, pipe, draft_length)

    def _pipeline_for(self, request: GenerationRequest, target: LoadedModel, drafter: Drafter | None) -> Pipeline:
        """The pipeline of one request: the server's gamma and cost-aware draft lengths, or the request's gamma."""
        if request.gamma is None:  # the server's gamma, and its cost-aware draft lengths if it has them
            return replace(self.pipeline, target=target, drafter=drafter)
        # an explicit gamma drafts that many tokens every call, as `--gamma` does
        return replace(self.pipeline, target=target, drafter=drafter, gamma=request.gamma, costs=None)

    @staticmethod
    def _generate(job: Job, pipe: Pipeline, draft_length: AdaptiveDraftLength | None) -> None:
        """Stream the generation's text to the job, then `Finished` (or end it as cancelled)."""
        request: GenerationRequest = job.request  # type: ignore[assignment]
        tokens = pipe.stream(
            torch.tensor(request.prompt_ids, dtype=torch.long),
            max_new_tokens=request.max_tokens,
            sampling=request.sampling,
            stop=request.stop,
            seed=request.seed,
            draft_length=draft_length,
        )
        pieces = []
        for piece in incremental_text(pipe, _chunks(tokens, job), request.stop):
            pieces.append(piece)
            job.emit(Delta(piece))
        if tokens.result is None:  # cancelled between two chunks
            job.end_cancelled()
            return
        job.emit(Finished("".join(pieces), tokens.result))


def _model_part(drafter: Drafter | None) -> EagleDrafter | ModelDrafter | None:
    """The draft model of a drafter (itself, or the model part of prompt lookup + model), else None."""
    inner = drafter.model if isinstance(drafter, LookupThenModelDrafter) else drafter
    return inner if isinstance(inner, (EagleDrafter, ModelDrafter)) else None


def _chunks(tokens: TokenStream, job: Job) -> Iterator[list[int]]:
    """The stream's token chunks, checking for cancellation before asking for the next one."""
    iterator = iter(tokens)
    try:
        while not job.cancelled:
            chunk = next(iterator, None)
            if chunk is None:
                return
            job.generated_tokens += len(chunk)
            if job.first_token is None:
                job.first_token = time.perf_counter()
            yield chunk
    finally:
        iterator.close()
