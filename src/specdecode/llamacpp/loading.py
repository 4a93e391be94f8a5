"""Loading a GGUF file on llama.cpp: the model, its tokenizer (transformers', as the other engines use) and EOS ids."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from specdecode.models.known import is_known_model, known_gguf_path
from specdecode.models.loading import DEFAULT_TARGET, LoadedModel

__all__ = ["LlamaCppModelInfo", "load_llamacpp", "gguf_path"]


@dataclass
class LlamaCppModelInfo:
    """Stands in for `LoadedModel.hf_model` on llama.cpp: the end-of-sequence ids llama.cpp reads from the file."""

    eos_token_ids: list[int]
    _generation_config: object | None = field(default=None, repr=False)

    @property
    def eos_token_id(self) -> list[int]:
        return self.eos_token_ids

    @property
    def generation_config(self):
        """A transformers GenerationConfig holding the EOS ids (made on first use: importing transformers is slow)."""
        if self._generation_config is None:
            from transformers import GenerationConfig

            self._generation_config = GenerationConfig(eos_token_id=self.eos_token_ids)
        return self._generation_config


def gguf_path(name_or_path: str | os.PathLike) -> Path:
    """The GGUF file behind a model name: a known model's file (`models.known`), or the path itself if it is a .gguf file."""
    source = str(name_or_path)
    if is_known_model(source):
        return known_gguf_path(source)
    path = Path(source)
    if path.suffix != ".gguf":
        raise ValueError(f"the llama.cpp engine runs GGUF files; {source} is not one (use --backend native or hf)")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    return path


def load_llamacpp(name_or_path: str | os.PathLike = DEFAULT_TARGET, *, max_length: int | None = None,
                  threads: int | None = None) -> LoadedModel:
    """A GGUF model (a known model's name or a .gguf path) on llama.cpp, as a LoadedModel.

    max_length: the context size (default `DEFAULT_MAX_LENGTH`); threads: llama.cpp's threads (default: all cores).
    """
    from specdecode.llamacpp.engine import DEFAULT_MAX_LENGTH, LlamaCppLM
    from specdecode.native.loading import gguf_tokenizer

    source = str(name_or_path)
    path = gguf_path(source)
    model = LlamaCppLM(path, name=source, max_length=max_length or DEFAULT_MAX_LENGTH, threads=threads)
    return LoadedModel(model, gguf_tokenizer(path), LlamaCppModelInfo(model.eos_token_ids()), source)
