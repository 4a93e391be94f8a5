"""The model side of the server: prompt encoding, drafter choice, and running one job on the model thread."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import TokenStream
from specdecode.drafters import Drafter, LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from specdecode.drafters.eagle import EagleDrafter
from specdecode.pipeline import Pipeline, incremental_text
from specdecode.server.errors import APIError
from specdecode.server.worker import Delta, Finished, Job

__all__ = ["GenerationRequest", "Engine", "finish_reason"]

NO_DRAFT = "none"


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


def finish_reason(reason: str) -> str:
    """Our finish reasons in OpenAI's words: eos/stop -> 'stop', length/context -> 'length'."""
    return "stop" if reason in ("eos", "stop") else "length"


class Engine:
    """A `Pipeline` served over HTTP: one target, the configured drafter, and the per-request alternatives."""

    def __init__(self, pipeline: Pipeline, *, model_id: str | None = None, draft_aliases: Iterable[str] = ()) -> None:
        if pipeline.tokenizer is None:
            raise ValueError("the target has no tokenizer, so it cannot serve text requests")
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

    # -- generation (model thread only)
    def run(self, job: Job) -> None:
        """Generate for `job`, emitting text deltas and then `Finished` (or stopping when it is cancelled)."""
        request: GenerationRequest = job.request  # type: ignore[assignment]
        drafter = self.drafters[request.draft]
        model = _model_part(drafter)
        if model is not None and request.min_confidence is not None:  # this request's, then the server's again
            model.min_confidence = request.min_confidence
        try:
            if request.gamma is None:  # the server's gamma, and its cost-aware draft lengths if it has them
                pipe = replace(self.pipeline, drafter=drafter)
            else:  # an explicit gamma drafts that many tokens every call, as `--gamma` does
                pipe = replace(self.pipeline, drafter=drafter, gamma=request.gamma, costs=None)
            tokens = pipe.stream(
                torch.tensor(request.prompt_ids, dtype=torch.long),
                max_new_tokens=request.max_tokens,
                sampling=request.sampling,
                stop=request.stop,
                seed=request.seed,
            )
            pieces = []
            for piece in incremental_text(pipe, _chunks(tokens, job), request.stop):
                pieces.append(piece)
                job.emit(Delta(piece))
        finally:
            if model is not None:
                model.min_confidence = self._min_confidence[request.draft]
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
