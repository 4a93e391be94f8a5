"""`NativeLM`: the native transformer behind the `LanguageModel` protocol (prefill / extend / rollback)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import TYPE_CHECKING

import torch

from specdecode.models.base import ContextLengthError, checked_token_ids
from specdecode.native.config import check_packing
from specdecode.native.model import KVCache, NativeTransformer

if TYPE_CHECKING:
    from specdecode.native.layout import LayoutChoice

__all__ = ["NativeLM", "CachedSequence", "DEFAULT_MAX_CACHE_LEN"]

DEFAULT_MAX_CACHE_LEN = 4096  # the cache is preallocated: 2 * layers * KV * D * max_len values


def _apply_quantization(model: NativeTransformer, quantize: str) -> str:
    """Quantize the model's weights as asked (in place); return the quantization it ends up with."""
    from specdecode.native.quant import check_quantize, current_quantization, quantize_model

    current = current_quantization(model)
    if check_quantize(quantize) in ("none", current):
        return current
    if current != "none":
        raise ValueError(f"the model is already quantized as {current!r}; "
                         f"build a fresh model for quantize={quantize!r}")
    quantize_model(model, quantize)
    return quantize


def _apply_packing(
    model: NativeTransformer, packing: str, quantized: bool, rows_per_call: int
) -> tuple[str, LayoutChoice | None]:
    """Pack the model's linear layers as asked (in place).

    Returns the packing it ends up with, and the timed `LayoutChoice` when 'auto' chose by timing.
    """
    from specdecode.native.fast import current_packing, pack_linears, packing_available

    current = current_packing(model)
    if quantized:  # int8 layers have their own kernel; there is nothing to pack
        if packing not in ("auto", "none"):
            raise ValueError(f"packing={packing!r} does not apply to an int8 model; use packing='auto' or 'none'")
        return "none", None
    if packing == "auto":
        if current != "none":
            return current, None
        if not (model.device.type == "cpu" and packing_available(model.dtype)):
            return "none", None
        rows = min(rows_per_call, model.config.max_position_embeddings - 1)  # no call feeds more
        if model.dtype == torch.float32 and rows > 1:  # which layout verifies fastest depends on the CPU
            from specdecode.native.layout import choose_packing

            choice = choose_packing(model, rows)
            return choice.packing, choice
        # float32: MKL's gemv beats oneDNN for one row, so keep both; bfloat16: oneDNN wins for any rows
        packing = {torch.float32: "dual", torch.bfloat16: "packed"}.get(model.dtype, "none")
    if packing == current:
        return current, None
    if current != "none":
        raise ValueError(f"the model is already packed as {current!r}; build a fresh model for packing={packing!r}")
    pack_linears(model, packing)
    return packing, None


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None off Linux / glibc."""
    path = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    libc = ctypes.CDLL(path) if path else None
    return getattr(libc, "malloc_trim", None)


def release_freed_memory() -> None:
    """Give heap memory freed by packing or quantization (the replaced weights) back to the OS.

    glibc keeps freed blocks below its (adaptive, up to 32 MiB) mmap threshold in the heap, so
    without this the replaced float32 weights would stay in the resident set.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class CachedSequence:
    """One sequence's positions in a static KV cache, shared by `NativeLM` and `native.batching.SlotLM`: how many
    prompt and generated tokens are cached, the room left, rollback (only a length moves), and the checks of
    what is fed. Subclasses set name, vocab_size and max_length."""

    name: str
    vocab_size: int
    max_length: int

    def __init__(self) -> None:
        self._prompt_length = 0
        self._num_generated = 0
        self._started = False
        self._features_from = 0  # features of positions before this one are unknown (see keep_features)

    @property
    def num_generated(self) -> int:
        return self._num_generated

    def room(self) -> int:
        return self.max_length - self._cached()

    def _cached(self) -> int:
        """Positions whose keys and values are in the cache."""
        return self._prompt_length + self._num_generated

    def _checked_prompt(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """prompt_ids as checked token ids that fit the context with room for one more token."""
        prompt_ids = checked_token_ids(prompt_ids, "prompt_ids", self.vocab_size, self.name)
        if prompt_ids.numel() >= self.max_length:
            raise ContextLengthError(
                f"{self.name}: the prompt has {prompt_ids.numel()} tokens but at most {self.max_length - 1} fit "
                f"(context window {self.max_length}, the KV cache size); shorten the prompt or raise max_cache_len"
            )
        return prompt_ids

    def _started_with(self, prompt_length: int) -> None:
        """The prompt's positions are cached: generation starts after them."""
        self._prompt_length, self._num_generated, self._started = prompt_length, 0, True

    def _checked_feed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids as checked token ids that fit after the cached ones (after a prefill)."""
        if not self._started:
            raise RuntimeError("call prefill() before extend()")
        token_ids = checked_token_ids(token_ids, "token_ids", self.vocab_size, self.name)
        if token_ids.numel() > self.room():
            raise ContextLengthError(
                f"{self.name}: feeding {token_ids.numel()} tokens would exceed the context window of {self.max_length} "
                f"positions (prompt {self._prompt_length}, generated {self._num_generated})"
            )
        return token_ids

    def _check_feature_range(self, start: int, end: int) -> None:
        cached = self._cached()
        if not self._features_from <= start <= end <= cached:
            raise ValueError(f"{self.name}: features of positions [{start}, {end}) asked; those of "
                             f"[{self._features_from}, {cached}) are known")

    def rollback(self, num_generated: int) -> None:
        """Forget generated tokens beyond the first num_generated: only the length moves, nothing is copied."""
        if not 0 <= num_generated <= self._num_generated:
            raise ValueError(f"num_generated must be in [0, {self._num_generated}], got {num_generated}")
        self._num_generated = num_generated


class NativeLM(CachedSequence):
    """A decoder-only `LanguageModel` on a `NativeTransformer` with a static KV cache.

    max_length = min(max_position_embeddings, sliding_window, max_cache_len): within a sliding
    window attention is full attention, so capping the context there keeps it exact.
    packing: 'none' (plain nn.Linear), 'packed' (weights prepacked for oneDNN: several rows cost little
    more than one), 'dual' (also a plain copy for single rows: fastest in float32, twice the weight
    memory) or 'auto' (on a CPU with oneDNN: for float32 dual, or with rows_per_call > 1 whichever of
    dual and none runs that many rows fastest here, timed once per machine (`specdecode.native.layout`,
    then `layout_choice`); packed for bfloat16 where the CPU has bfloat16 support; else none); see
    `specdecode.native.fast`. rows_per_call: the rows most calls will feed (gamma + 1 for a target
    verifying gamma draft tokens). quantize: 'none' or 'int8' (weight-only int8 with per-channel scales,
    `specdecode.native.quant`; an int8 model is not packed). Both replace the model's layers in
    place. compile=True runs the model through torch.compile (minutes to start, not faster on CPU
    in our measurements).
    """

    def __init__(
        self,
        model: NativeTransformer,
        name: str = "native",
        max_cache_len: int = DEFAULT_MAX_CACHE_LEN,
        *,
        packing: str = "auto",
        rows_per_call: int = 1,
        quantize: str = "none",
        compile: bool = False,
    ) -> None:
        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 2:
            raise ValueError(f"max_cache_len must be an integer >= 2, got {max_cache_len!r}")
        if isinstance(rows_per_call, bool) or not isinstance(rows_per_call, int) or rows_per_call < 1:
            raise ValueError(f"rows_per_call must be an integer >= 1, got {rows_per_call!r}")
        check_packing(packing)
        if quantize != "none" and packing in ("packed", "dual"):
            raise ValueError(f"packing={packing!r} does not apply to quantize={quantize!r}; "
                             "use packing='auto' or 'none'")
        if compile and packing in ("packed", "dual"):
            raise ValueError("compile=True packs the weights itself (inductor freezing); use packing='none'")
        config = model.config
        self.model = model.eval().requires_grad_(False)
        self.name = name
        self.config = config
        self.vocab_size = config.vocab_size
        self.max_length = min(config.max_position_embeddings, config.sliding_window or max_cache_len, max_cache_len)
        self.device = model.device
        self.quantize = _apply_quantization(model, quantize)
        self.packing, self.layout_choice = _apply_packing(
            model, "none" if compile else packing, quantized=self.quantize != "none", rows_per_call=rows_per_call
        )
        if self.packing != "none" or self.quantize != "none" or self.layout_choice is not None:
            release_freed_memory()  # the replaced weights (or the layout that lost the timing)
        self._forward = model
        if compile:
            from specdecode.native.fast import compiled_forward

            self._forward = compiled_forward(model)
        self._cache: KVCache = model.new_cache(self.max_length)
        super().__init__()

    def _run(self, token_ids: torch.Tensor, start: int, last_only: bool) -> torch.Tensor:
        end = start + token_ids.numel()  # within the cache: prefill and extend check the room first
        positions = torch.arange(start, end, device=self.device)
        logits = self._forward(token_ids.to(self.device), positions, self._cache, last_only=last_only, end=end)
        return logits.float()

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        prompt_ids = self._checked_prompt(prompt_ids)
        self._started_with(prompt_ids.numel())
        self._features_from = 0
        return self._run(prompt_ids, 0, last_only=True)[0]  # [V]

    @torch.inference_mode()
    def extend(self, token_ids: torch.Tensor) -> torch.Tensor:
        token_ids = self._checked_feed(token_ids)
        logits = self._run(token_ids, self._cached(), last_only=False)  # [n, V]
        self._num_generated += token_ids.numel()
        return logits

    def keep_features(self) -> None:
        """Keep each position's final-norm output (what the head reads) for `features`: an EAGLE drafter reads them.

        A [max_length, hidden] buffer next to the KV cache, indexed by position, so rollback needs nothing more.
        """
        if self._cache.features is None:
            self._cache.keep_features()
            self._features_from = self._cached()  # earlier positions were computed without writing theirs

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The model's token embeddings [n, hidden] (float, packed or int8 as the model holds them)."""
        return self.model.embed(token_ids)

    def features(self, start: int, end: int) -> torch.Tensor:
        """Final-norm outputs [end - start, hidden] (float32) of the cached positions start .. end - 1."""
        if self._cache.features is None:
            raise RuntimeError(f"{self.name}: call keep_features() before the forward passes whose features you need")
        self._check_feature_range(start, end)
        return self._cache.features[start:end].float()

