"""`LlamaCppLM`: a GGUF model on llama.cpp behind the `LanguageModel` protocol (prefill / extend / rollback)."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specdecode.llamacpp.binding import llama_cpp, recent_errors
from specdecode.models.base import ContextLengthError, checked_token_ids

__all__ = ["LlamaCppLM", "LlamaCppShape", "DEFAULT_MAX_LENGTH", "default_threads"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 4096  # llama.cpp's KV cache for this many positions (capped at the model's training context)
_BATCH = 512  # the most tokens one llama_decode call takes; longer prompts are decoded in chunks
_DECODE_ERRORS = {1: "no KV cache slot for the batch", 2: "aborted", -1: "invalid input batch"}


def default_threads() -> int:
    """The cores this process may run on (llama-cpp-python's own default is half of them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _embedding_table(path: Path) -> torch.Tensor:
    """token_embd.weight of a GGUF file, dequantized to float32 [vocab, hidden]: about 2 s for SmolLM2-135M, so it
    is kept in <cache root>/embeddings once made (a read-only or full cache only costs the time again)."""
    from safetensors.torch import load_file, save_file

    from specdecode.models.loading import cache_root

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_root() / "embeddings" / f"{path.stem}-{key}.safetensors"
    if cached.is_file():
        return load_file(cached)["weight"]
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensor = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    table = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    weight = torch.from_numpy(np.array(table.reshape(int(tensor.shape[1]), int(tensor.shape[0]))))  # dims innermost first
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = cached.with_suffix(".tmp")
        save_file({"weight": weight}, staging)
        os.replace(staging, cached)
    except OSError as error:
        logger.warning("cannot cache the token embeddings of %s in %s: %s", path.name, cached, error)
    return weight


def _check_threads(threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    return threads


@dataclass(frozen=True)
class LlamaCppShape:
    """What an EAGLE draft checks of its target: the width of its features and of its vocabulary."""

    hidden_size: int
    vocab_size: int


class LlamaCppLM:
    """A decoder-only `LanguageModel` on llama.cpp: one sequence (id 0) in llama.cpp's KV cache.

    prefill clears the cache and decodes the prompt (in chunks of 512 tokens) for its last token's
    logits; extend decodes the fed tokens in one batch with the logits of every one of them; rollback
    removes the cache cells past the kept length (llama_memory_seq_rm), so nothing is recomputed.
    max_length: the context size (llama.cpp's n_ctx), at most the model's training context.
    threads: llama.cpp's threads for single tokens and batches alike (default: every core it may use).
    keep_features() makes llama.cpp also output each position's final-norm output (its 'embeddings' with no
    pooling: what the output head reads) for an EAGLE draft; llama.cpp then computes the logits of every
    prompt token too (about a fifth more prefill on SmolLM2-135M).
    """

    def __init__(self, path: str | os.PathLike, *, name: str | None = None, max_length: int = DEFAULT_MAX_LENGTH,
                 threads: int | None = None) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
        self.threads = _check_threads(default_threads() if threads is None else threads)
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        lib = llama_cpp()
        self._lib = lib
        self.name = name or str(path)
        self._model = self._ctx = self._batch = None
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0  # a CPU build; a GPU build of the binding would offload with this raised
        self._model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            details = "; ".join(recent_errors()) or "see the debug log of 'specdecode.llamacpp'"
            raise ValueError(f"{path}: llama.cpp cannot load this GGUF file ({details})")
        context = lib.llama_context_default_params()
        context.n_ctx = min(max_length, lib.llama_model_n_ctx_train(self._model))
        context.n_batch = context.n_ubatch = _BATCH
        context.n_seq_max = 1
        context.n_threads = context.n_threads_batch = self.threads
        context.no_perf = True
        self._ctx = lib.llama_init_from_model(self._model, context)
        if not self._ctx:
            raise RuntimeError(f"{self.name}: llama.cpp could not create a context ({'; '.join(recent_errors())})")
        self._memory = lib.llama_get_memory(self._ctx)
        self.vocab_size = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model)))
        self.max_length = min(max_length, int(lib.llama_n_ctx(self._ctx)))
        self.config = LlamaCppShape(int(lib.llama_model_n_embd(self._model)), self.vocab_size)
        self.device = torch.device("cpu")
        self.path = path
        self._features: np.ndarray | None = None  # [max_length, hidden]: final-norm outputs by position
        self._features_from = 0  # features of positions before this one are unknown
        self._embedding: torch.nn.Embedding | None = None
        self._batch = lib.llama_batch_init(_BATCH, 0, 1)
        batch = self._batch
        self._tokens = np.ctypeslib.as_array(batch.token, shape=(_BATCH,))  # views of the batch's arrays
        self._positions = np.ctypeslib.as_array(batch.pos, shape=(_BATCH,))
        self._outputs = np.ctypeslib.as_array(batch.logits, shape=(_BATCH,))
        np.ctypeslib.as_array(batch.n_seq_id, shape=(_BATCH,))[:] = 1
        for i in range(_BATCH):
            batch.seq_id[i][0] = 0
        self._prompt_length = 0
        self._num_generated = 0
        self._started = False

    # ------------------------------------------------------------------ protocol

    @property
    def num_generated(self) -> int:
        return self._num_generated

    def room(self) -> int:
        return self.max_length - self._prompt_length - self._num_generated

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        prompt = checked_token_ids(prompt_ids, "prompt_ids", self.vocab_size, self.name).numpy()
        if len(prompt) >= self.max_length:
            raise ContextLengthError(
                f"{self.name}: the prompt has {len(prompt)} tokens but at most {self.max_length - 1} fit "
                f"(context size {self.max_length}); shorten the prompt or raise the context size"
            )
        self._lib.llama_memory_clear(self._memory, True)
        self._prompt_length, self._num_generated, self._started = 0, 0, False
        self._features_from = 0
        for start in range(0, len(prompt), _BATCH):
            self._decode(prompt[start:start + _BATCH], start, all_logits=False)
        self._prompt_length, self._started = len(prompt), True
        return self._logits(1)[0]  # [V]

    @torch.inference_mode()
    def extend(self, token_ids: torch.Tensor) -> torch.Tensor:
        if not self._started:
            raise RuntimeError("call prefill() before extend()")
        tokens = checked_token_ids(token_ids, "token_ids", self.vocab_size, self.name).numpy()
        if len(tokens) > self.room():
            raise ContextLengthError(
                f"{self.name}: feeding {len(tokens)} tokens would exceed the context size of {self.max_length} "
                f"positions (prompt {self._prompt_length}, generated {self._num_generated})"
            )
        rows = []
        for start in range(0, len(tokens), _BATCH):
            chunk = tokens[start:start + _BATCH]
            self._decode(chunk, self._prompt_length + self._num_generated, all_logits=True)
            self._num_generated += len(chunk)
            rows.append(self._logits(len(chunk)))
        return rows[0] if len(rows) == 1 else torch.cat(rows)  # [n, V]

    def rollback(self, num_generated: int) -> None:
        """Forget generated tokens beyond the first num_generated: their KV cells are removed."""
        if not 0 <= num_generated <= self._num_generated:
            raise ValueError(f"num_generated must be in [0, {self._num_generated}], got {num_generated}")
        if num_generated < self._num_generated:
            if not self._lib.llama_memory_seq_rm(self._memory, 0, self._prompt_length + num_generated, -1):
                raise RuntimeError(f"{self.name}: llama.cpp could not remove cache cells")
        self._num_generated = num_generated

    # ------------------------------------------------------------------ features (for an EAGLE draft)

    def keep_features(self) -> None:
        """Keep each position's final-norm output for `features`, from the next llama_decode on."""
        if self._features is None:
            self.embed_tokens(torch.zeros(1, dtype=torch.long))  # the table now (seconds once), not in the first draft
            self._lib.llama_set_embeddings(self._ctx, True)
            self._features = np.zeros((self.max_length, self.config.hidden_size), dtype=np.float32)
            self._features_from = self._prompt_length + self._num_generated

    def features(self, start: int, end: int) -> torch.Tensor:
        """Final-norm outputs [end - start, hidden] (float32) of the cached positions start .. end - 1."""
        if self._features is None:
            raise RuntimeError(f"{self.name}: call keep_features() before the forward passes whose features you need")
        cached = self._prompt_length + self._num_generated
        if not self._features_from <= start <= end <= cached:
            raise ValueError(f"{self.name}: features of positions [{start}, {end}) asked; those of "
                             f"[{self._features_from}, {cached}) are known")
        return torch.from_numpy(self._features[start:end].copy())

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The model's token embeddings [n, hidden] (float32: the GGUF table dequantized, `_embedding_table`)."""
        if self._embedding is None:
            self._embedding = torch.nn.Embedding.from_pretrained(_embedding_table(self.path), freeze=True)
        return self._embedding(token_ids)

    def eos_token_ids(self) -> list[int]:
        """The end-of-sequence id the GGUF file names (tokenizer.ggml.eos_token_id), as the native engine reads it."""
        eos = int(self._lib.llama_vocab_eos(self._lib.llama_model_get_vocab(self._model)))
        return [eos] if eos >= 0 else []

    # ------------------------------------------------------------------ llama.cpp calls

    def _decode(self, tokens: np.ndarray, start: int, all_logits: bool) -> None:
        """One llama_decode of tokens [n] at positions start .. start + n - 1 (n <= _BATCH)."""
        n = len(tokens)
        self._tokens[:n] = tokens
        self._positions[:n] = np.arange(start, start + n)
        self._outputs[:n] = 1 if all_logits else 0
        self._outputs[n - 1] = 1
        self._batch.n_tokens = n
        status = self._lib.llama_decode(self._ctx, self._batch)
        if status != 0:
            reason = _DECODE_ERRORS.get(status, "fatal error")
            raise RuntimeError(f"{self.name}: llama_decode failed with status {status} ({reason})")
        if self._features is not None:  # every token is an output then: its final-norm output, by position
            pointer = self._lib.llama_get_embeddings(self._ctx)
            self._features[start:start + n] = np.ctypeslib.as_array(pointer, shape=(n, self.config.hidden_size))

    def _logits(self, rows: int) -> torch.Tensor:
        """A copy of the last decode's logits [rows, V] (llama.cpp overwrites its buffer on the next decode)."""
        pointer = self._lib.llama_get_logits_ith(self._ctx, -rows) if rows == 1 else self._lib.llama_get_logits(self._ctx)
        return torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(rows, self.vocab_size)).copy())

    def close(self) -> None:
        """Free llama.cpp's context, model and batch (also done when the object is collected)."""
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
        if self._ctx:
            lib.llama_free(self._ctx)
        if self._model:
            lib.llama_model_free(self._model)
        self._batch = self._ctx = self._model = None
        self._started = False

    def __del__(self) -> None:
        try:
            self.close()
        except (AttributeError, TypeError):  # interpreter shutdown: the binding's globals are gone already
            pass
