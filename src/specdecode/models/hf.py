"""Adapters from Hugging Face `transformers` models to the `LanguageModel` protocol.

`HFCausalLM` wraps an `AutoModelForCausalLM` (Llama, Qwen2, GPT-2, ...);
`HFSeq2SeqLM` wraps an `AutoModelForSeq2SeqLM` (T5, the paper's own setting).
Both keep a `DynamicCache` and roll it back by cropping its self-attention part.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel

from specdecode.models.base import ContextLengthError, checked_token_ids

__all__ = ["HFCausalLM", "HFSeq2SeqLM", "wrap_hf_model"]

# Models with relative positions (T5) have no hard context limit; this bounds the cache instead.
_UNBOUNDED_CONTEXT = 1 << 20


def _context_limit(config) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return _UNBOUNDED_CONTEXT


class _HFAdapter:
    """Shared state of both adapters: the wrapped model, its cache and the counters.

    Subclasses say how to start a sequence (`_start`), how to run the decoder over
    new tokens (`_decode`) and where the self-attention cache lives.
    """

    max_length: int

    def __init__(self, model: PreTrainedModel, name: str | None = None) -> None:
        self.model = model.eval()
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.max_length = _context_limit(model.config)
        self._cache: DynamicCache | EncoderDecoderCache | None = None
        self._prompt_length = 0
        self._num_generated = 0

    @property
    def num_generated(self) -> int:
        return self._num_generated

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        prompt_ids = checked_token_ids(prompt_ids, "prompt_ids", self.vocab_size, self.name)
        if prompt_ids.numel() > self._prompt_limit():
            raise ContextLengthError(
                f"{self.name}: the prompt has {prompt_ids.numel()} tokens but at most {self._prompt_limit()} fit "
                f"(context window {self.max_length}); shorten the prompt"
            )
        self._prompt_length = prompt_ids.numel()
        self._num_generated = 0
        return self._start(prompt_ids[None].to(self.device))[0, -1].float()

    @torch.inference_mode()
    def extend(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self._cache is None:
            raise RuntimeError("call prefill() before extend()")
        token_ids = checked_token_ids(token_ids, "token_ids", self.vocab_size, self.name)
        if token_ids.numel() > self.room():
            raise ContextLengthError(
                f"{self.name}: feeding {token_ids.numel()} tokens would exceed the context window of {self.max_length} "
                f"positions (prompt {self._prompt_length}, generated {self._num_generated})"
            )
        logits = self._decode(token_ids[None].to(self.device))
        self._num_generated += token_ids.numel()
        return logits[0].float()

    def rollback(self, num_generated: int) -> None:
        if not 0 <= num_generated <= self._num_generated:
            raise ValueError(f"num_generated must be in [0, {self._num_generated}], got {num_generated}")
        remove = self._num_generated - num_generated
        if remove:
            self._self_attention_cache().crop(-remove)
        self._num_generated = num_generated

    def room(self) -> int:
        raise NotImplementedError

    def _prompt_limit(self) -> int:
        raise NotImplementedError

    def _start(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Fresh cache, run the prompt [1, P]; return logits [1, *, V] whose last row predicts the first token."""
        raise NotImplementedError

    def _decode(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Run generated tokens [1, n] through the cached model; return logits [1, n, V]."""
        raise NotImplementedError

    def _self_attention_cache(self) -> DynamicCache:
        raise NotImplementedError


class HFCausalLM(_HFAdapter):
    """A decoder-only Hugging Face model: prompt and generated tokens share one KV cache."""

    def room(self) -> int:
        return self.max_length - self._prompt_length - self._num_generated

    def _prompt_limit(self) -> int:
        return self.max_length - 1  # room for at least the first generated token

    def _start(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        # no config: every layer keeps every position, so crop() works past a sliding window too (a sliding layer's
        # cache refuses to crop once full); the model still applies its sliding-window mask
        self._cache = DynamicCache()
        return self.model(input_ids=prompt_ids, cache=self._cache, use_cache=True, logits_to_keep=1).logits

    def _decode(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=token_ids, cache=self._cache, use_cache=True).logits

    def _self_attention_cache(self) -> DynamicCache:
        return self._cache


class HFSeq2SeqLM(_HFAdapter):
    """An encoder-decoder Hugging Face model: the prompt is encoded once, generated tokens feed the decoder."""

    def __init__(self, model: PreTrainedModel, name: str | None = None) -> None:
        super().__init__(model, name)
        start = model.config.decoder_start_token_id
        if start is None:
            raise ValueError(f"{self.name}: config.decoder_start_token_id is not set")
        self.decoder_start_token_id = int(start)
        self._encoder_outputs = None

    def room(self) -> int:
        # the decoder holds the start token plus the generated tokens
        return self.max_length - 1 - self._num_generated

    def _prompt_limit(self) -> int:
        return self.max_length  # the encoder's own window

    def _start(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        config = self.model.config
        self._cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        self._encoder_outputs = self.model.get_encoder()(input_ids=prompt_ids)
        return self._decode(torch.tensor([[self.decoder_start_token_id]], device=self.device))

    def _decode(self, token_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(encoder_outputs=self._encoder_outputs, decoder_input_ids=token_ids, cache=self._cache, use_cache=True)
        return out.logits

    def _self_attention_cache(self) -> DynamicCache:
        return self._cache.self_attention_cache


def wrap_hf_model(model: PreTrainedModel, name: str | None = None) -> HFCausalLM | HFSeq2SeqLM:
    """Pick the adapter that fits a loaded `transformers` model."""
    if model.config.is_encoder_decoder:
        return HFSeq2SeqLM(model, name)
    return HFCausalLM(model, name)
