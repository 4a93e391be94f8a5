"""Continuous batching on the native engine: each sequence a `LanguageModel` of its own, their calls run together.

`BatchedNativeLM` holds one `SlotCache`; `open()` gives a sequence a free slot as a `SlotLM`, which the ordinary
decoding loop drives (`decoding.stream`) on its own thread, with its own drafter, sampling and generator. Each
`SlotLM.extend` (and `prefill`) waits until every open sequence has asked for its next rows, then one thread runs
them all in a single forward pass (`slots.forward_rows`) and hands each sequence its logits: the sequences
advance in lockstep, each by its own number of accepted tokens. A new request's prompt joins the next pass (its
rows share the matmuls, its attention runs on its own); the start it shares with what some slot holds (a chat
template's system prompt) is copied from there instead of computed. A closed slot leaves at once.

A pass with a single sequence runs `NativeTransformer.forward` on its slot, the arithmetic of `NativeLM`.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdecode.native.engine import CachedSequence
from specdecode.native.model import NativeTransformer
from specdecode.native.slots import SlotCache, SlotRows, forward_rows

__all__ = ["BatchedNativeLM", "SlotLM", "NoFreeSlotError", "DEFAULT_MAX_BATCH"]

DEFAULT_MAX_BATCH = 32  # `specdecode serve --max-batch` on the native engine (load test: docs/server-batching.md)


class NoFreeSlotError(RuntimeError):
    """Every slot holds a sequence."""


@dataclass
class _Request:
    """One sequence's rows waiting for the next pass, and what the pass gave back."""

    rows: SlotRows
    logits: torch.Tensor | None = None
    error: BaseException | None = None


@dataclass
class PassCounts:
    """What the passes were: sequences per pass and rows per pass, with the seconds spent in passes."""

    sequences: Counter = field(default_factory=Counter)
    rows: Counter = field(default_factory=Counter)
    seconds: float = 0.0


class BatchedNativeLM:
    """Up to `max_batch` sequences of up to `max_length` positions each on one `NativeTransformer`.

    Thread-safe: each open `SlotLM` belongs to one thread. The model's own weights are shared, packing and
    quantization included, so the engine adds only the slots' KV cache (resident as the contexts grow).
    on_pass(sequences, rows): called after every pass (metrics).
    """

    def __init__(self, model: NativeTransformer, max_batch: int, max_length: int, name: str = "native",
                 on_pass: Callable[[int, int], None] | None = None) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
        self.model = model
        self.name = name
        self.config = model.config
        self.vocab_size = model.config.vocab_size
        self.max_batch, self.max_length = max_batch, max_length
        self.cache = SlotCache(model, max_batch, max_length)
        self.passes = PassCounts()
        self.on_pass = on_pass
        self._free = list(range(max_batch))  # a heap: the lowest free slot first, so passes span few slots
        self._open: set[SlotLM] = set()
        self._waiting: dict[SlotLM, _Request] = {}
        self._passing = False  # a thread is running a pass
        self._condition = threading.Condition()
        self._model_lock = threading.Lock()  # one forward pass at a time; it also guards _contents
        self._contents: list[list[int]] = [[] for _ in range(max_batch)]  # the tokens whose keys each slot holds
        self.reused_prompt_tokens = 0  # prompt positions copied from a slot rather than computed

    @property
    def open_sequences(self) -> int:
        with self._condition:
            return len(self._open)

    def batch_state(self, sequence: "SlotLM") -> tuple[int, int]:
        """(open sequences, rows the others fed in their last pass; 1 for one that has not fed any yet)."""
        with self._condition:
            others = sum(other.last_rows for other in self._open if other is not sequence)
            return max(1, len(self._open)), others

    def open(self) -> "SlotLM":
        """A free slot as a fresh sequence; NoFreeSlotError when all `max_batch` are taken."""
        with self._condition:
            if not self._free:
                raise NoFreeSlotError(f"all {self.max_batch} slots are in use")
            sequence = SlotLM(self, heapq.heappop(self._free))
            self._open.add(sequence)
            return sequence

    def _close(self, sequence: "SlotLM") -> None:
        with self._condition:
            if sequence not in self._open:
                return
            self._open.discard(sequence)
            self._waiting.pop(sequence, None)
            heapq.heappush(self._free, sequence.slot)
            self._condition.notify_all()  # the others may all be waiting for this one

    def _keep_features(self) -> None:
        """Features from now on for every slot; an open sequence knows none of the positions it has cached so far."""
        with self._condition:
            if self.cache.features is None:
                with self._model_lock:
                    self.cache.keep_features()
                    self._contents = [[] for _ in range(self.max_batch)]  # computed without features: no reuse
                for sequence in self._open:
                    sequence._features_from = sequence._cached()

    def _reuse_prefix(self, slot: int, prompt: list[int]) -> int:
        """Put into `slot` the keys and values of the longest start of `prompt` some slot already holds (a chat
        template's system prompt: most requests share it), copied unless the slot holds them itself; return its
        length (at most len(prompt) - 1: the last position is computed, for its logits). Below MIN_REUSE: 0."""
        with self._model_lock:
            best, source = 0, slot
            for other, contents in enumerate(self._contents):
                shared = _common_prefix(contents, prompt, len(prompt) - 1)
                if shared > best or (shared == best and other == slot):
                    best, source = shared, other
            if best < MIN_REUSE:
                return 0
            if source != slot:
                self.cache.storage[:, :, slot, :, :best] = self.cache.storage[:, :, source, :, :best]
                if self.cache.features is not None:
                    self.cache.features[slot, :best] = self.cache.features[source, :best]
                self.cache.wrote(slot, best)
            self._contents[slot] = prompt[:best]
            self.reused_prompt_tokens += best
            return best

    def _extend(self, sequence: "SlotLM", rows: SlotRows) -> torch.Tensor:
        """The logits of `rows`, from the next pass: run by whichever thread completes the set of waiting sequences."""
        request = _Request(rows)
        with self._condition:
            self._waiting[sequence] = request
            while request.logits is None and request.error is None:
                if not self._passing and self._waiting and len(self._waiting) == len(self._open):
                    batch, self._waiting = list(self._waiting.values()), {}
                    self._passing = True
                    self._condition.release()
                    try:
                        self._run_pass(batch)
                    finally:
                        self._condition.acquire()
                        self._passing = False
                        self._condition.notify_all()
                else:
                    self._condition.wait()
        if request.error is not None:
            raise request.error
        return request.logits

    def forward(self, parts: list[SlotRows]) -> list[torch.Tensor]:
        """One pass over `parts` (distinct slots), without the scheduling: the logits of each (`forward_rows`; a
        single part runs `NativeTransformer.forward` on its slot, the arithmetic of `NativeLM`). For callers that
        hold no open sequence (timing the passes); sequences go through `SlotLM`."""
        if len(parts) > 1:
            return forward_rows(self.model, self.cache, parts)
        rows = parts[0]
        n, first, device = rows.tokens.numel(), rows.start, self.model.device
        logits = self.model(rows.tokens.to(device), torch.arange(first, first + n, device=device),
                            self.cache.slot(rows.slot), last_only=rows.last_only, end=first + n)
        self.cache.wrote(rows.slot, first + n)
        return [logits.float()]

    def _run_pass(self, batch: list[_Request]) -> None:
        """One forward pass over every request's rows; each gets its logits, or the error of the pass."""
        try:
            start = time.perf_counter()
            with self._model_lock:
                logits = self.forward([r.rows for r in batch])
                for request in batch:  # what each slot now holds (rolled-back tokens are overwritten here)
                    part = request.rows
                    self._contents[part.slot] = self._contents[part.slot][: part.start] + part.tokens.tolist()
            rows = sum(r.rows.tokens.numel() for r in batch if not r.rows.last_only)  # prompts apart
            self.passes.seconds += time.perf_counter() - start
            self.passes.sequences[len(batch)] += 1
            self.passes.rows[rows] += 1
            for request, out in zip(batch, logits):
                request.logits = out
            if self.on_pass is not None:
                self.on_pass(len(batch), rows)
        except BaseException as error:  # every sequence in the pass is told; none is left waiting
            for request in batch:
                request.error = error
            if not isinstance(error, Exception):
                raise


MIN_REUSE = 8  # the shortest prompt start worth copying from another slot


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many first tokens a and b share, at most limit."""
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SlotLM(CachedSequence):
    """One sequence of a `BatchedNativeLM`: a `LanguageModel` (and an EAGLE draft's `FeatureModel`) on its slot.

    Every open sequence is driven by a thread of its own (a pass waits for all of them: a second open sequence
    on the same thread would wait forever); `close()` (or the with-block's end) frees the slot for the next.
    """

    def __init__(self, batch: BatchedNativeLM, slot: int) -> None:
        self._batch = batch
        self.slot = slot
        self.name = batch.name
        self.config = batch.config
        self.vocab_size = batch.vocab_size
        self.max_length = batch.max_length
        self.device = batch.model.device
        super().__init__()
        self._closed = False
        self.last_rows = 1  # the rows its last pass fed (what the others' draft lengths reckon with)

    def __enter__(self) -> "SlotLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Leave the batch: the slot is free for another sequence (idempotent)."""
        self._closed = True
        self._batch._close(self)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name}: slot {self.slot} was closed")

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        self._check_open()
        prompt_ids = self._checked_prompt(prompt_ids)
        self._features_from = 0
        reused = self._batch._reuse_prefix(self.slot, prompt_ids.tolist())  # positions [0, reused) are in the slot
        logits = self._batch._extend(self, SlotRows(self.slot, prompt_ids[reused:], reused, last_only=True))  # [1, V]
        self._started_with(prompt_ids.numel())
        return logits[0]  # [V]

    @torch.inference_mode()
    def extend(self, token_ids: torch.Tensor) -> torch.Tensor:
        self._check_open()
        token_ids = self._checked_feed(token_ids)
        self.last_rows = token_ids.numel()
        logits = self._batch._extend(self, SlotRows(self.slot, token_ids, self._cached()))  # [n, V]
        self._num_generated += token_ids.numel()
        return logits

    # -- what an EAGLE draft reads (`drafters.eagle.FeatureModel`)
    def keep_features(self) -> None:
        """Keep each position's final-norm output from now on (`NativeLM.keep_features`)."""
        self._batch._keep_features()

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._batch.model.embed(token_ids)

    def features(self, start: int, end: int) -> torch.Tensor:
        """Final-norm outputs [end - start, hidden] (float32) of the cached positions start .. end - 1."""
        features = self._batch.cache.features
        if features is None:
            raise RuntimeError(f"{self.name}: call keep_features() before the forward passes whose features you need")
        self._check_feature_range(start, end)
        return features[self.slot, start:end].float()
