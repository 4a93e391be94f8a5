"""Distilled draft models: small native transformers trained by `specdecode distill`, and the bundled one.

A draft directory holds
    draft_config.json   format tag, the NativeConfig, output vocabulary size, target, training report
    model.safetensors   weights (stored in bfloat16 to keep the package small; run in float32), the
                        embedding optionally as int8 `embed.qweight` [V, hidden] with float32 `embed.scales` [V],
                        and `output_ids` [K]: the target token ids the head predicts
    tokenizer files     the target's tokenizer (so the pair is checked like any other draft)
    README.md           the model card
With a reduced output vocabulary (K < V) the head scores only the K most frequent target tokens;
`ReducedVocabLM` widens its logits to the target's V with -inf elsewhere, so q is exactly zero
there and verification stays exact.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specdecode.models.base import LanguageModel
from specdecode.models.loading import DEFAULT_TARGET, LoadedModel
from specdecode.native.config import NativeConfig
from specdecode.native.engine import NativeLM
from specdecode.native.model import NativeTransformer, skipped_initialization
from specdecode.native.quant import Int8Embedding

__all__ = [
    "FORMAT",
    "ReducedVocabLM",
    "widen_logits",
    "read_draft_config",
    "read_draft_weights",
    "write_draft_directory",
    "saved_tokenizer",
    "build_draft_transformer",
    "save_draft",
    "load_draft_transformer",
    "load_distilled",
    "is_distilled_draft",
    "bundled_draft_dir",
]

FORMAT = "specdecode-distilled-draft"
CONFIG_FILE = "draft_config.json"
WEIGHTS_FILE = "model.safetensors"
_BUNDLED = {DEFAULT_TARGET: "smollm2_135m_instruct"}  # target -> folder in specdecode/drafts/
_INT8_EMBEDDING_KEYS = ("embed.qweight", "embed.scales")  # an Int8Embedding's buffers, stored as they are


def build_draft_transformer(
    config: NativeConfig, output_vocab_size: int, dtype: torch.dtype = torch.float32, int8_embedding: bool = False
) -> NativeTransformer:
    """A NativeTransformer in dtype whose head scores output_vocab_size tokens (untied from the embedding).

    int8_embedding: the token embedding is an `Int8Embedding` (buffers, not trained), zero until loaded.
    """
    if config.tie_word_embeddings:
        raise ValueError("a distilled draft has its own head: tie_word_embeddings must be False")
    if not 1 <= output_vocab_size <= config.vocab_size:
        raise ValueError(f"output_vocab_size must be in [1, {config.vocab_size}], got {output_vocab_size}")
    model = NativeTransformer(config, dtype)
    if output_vocab_size != config.vocab_size:
        model.lm_head = nn.Linear(config.hidden_size, output_vocab_size, bias=False, dtype=dtype)
    if int8_embedding:
        qweight = torch.zeros(config.vocab_size, config.hidden_size, dtype=torch.int8)
        model.embed = Int8Embedding(qweight, torch.ones(config.vocab_size), dtype)
    return model


def save_draft(
    directory: Path, model: NativeTransformer, output_ids: torch.Tensor, target: str, tokenizer, report: Mapping
) -> None:
    """Write a draft directory (config, bfloat16 weights with output_ids, tokenizer); the model card is separate.

    An `Int8Embedding` (a draft cut from its target) is stored as it is: int8 `embed.qweight`, float32 `embed.scales`.
    """
    state = {
        k: (v if k in _INT8_EMBEDDING_KEYS else v.to(torch.bfloat16)).detach().contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("rope_")
    }
    write_draft_directory(directory, state, output_ids, model.config, target, tokenizer, report)


def write_draft_directory(directory: Path, state: Mapping[str, torch.Tensor], output_ids: torch.Tensor,
                          native_config: NativeConfig, target: str, tokenizer, report: Mapping,
                          kind: str | None = None) -> None:
    """Write a draft directory: tokenizer, weights `state` with output_ids, then draft_config.json (with `kind` when
    given), whose presence makes the directory a draft: one interrupted part-way is not taken for a whole one."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).unlink(missing_ok=True)  # rewriting: not a draft until it is whole again
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    save_file({**state, "output_ids": output_ids.to(torch.int32).contiguous()}, directory / WEIGHTS_FILE)
    config = {
        "format": FORMAT,
        "version": 1,
        **({"kind": kind} if kind else {}),
        "target": target,
        "output_vocab_size": int(output_ids.numel()),
        "native_config": native_config.to_dict(),
        "report": dict(report),
    }
    staged = directory / (CONFIG_FILE + ".tmp")
    staged.write_text(json.dumps(config, indent=2) + "\n")
    # safetensors writes its file owner-only (0600); a draft directory is made to be shared, so the weights
    # get the mode the config file got from the umask
    shutil.copymode(staged, directory / WEIGHTS_FILE)
    staged.replace(directory / CONFIG_FILE)


def read_draft_weights(directory: Path, label: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the weights of a draft directory, its output_ids [K]); label names the draft in the error if they are missing."""
    if not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{label} {directory} has no {WEIGHTS_FILE}")
    state = load_file(directory / WEIGHTS_FILE)
    return state, state.pop("output_ids").long()


def saved_tokenizer(directory: Path):
    """The tokenizer saved in a draft directory, or None when it holds none."""
    from specdecode.models.tokenizer import load_saved_tokenizer

    return load_saved_tokenizer(directory) if (directory / "tokenizer_config.json").is_file() else None


def is_distilled_draft(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def read_draft_config(directory: Path) -> dict:
    """draft_config.json of a distilled-draft directory, its format checked."""
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"not a distilled draft: {config_path} is missing")
    config = json.loads(config_path.read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{config_path} is not a {FORMAT} file (format={config.get('format')!r})")
    return config


def load_draft_transformer(directory: str | Path, dtype: torch.dtype = torch.float32) -> tuple[NativeTransformer, torch.Tensor, dict]:
    """The draft's NativeTransformer, its output_ids [K] and its draft_config.json contents.

    An embedding stored in int8 stays an `Int8Embedding` (its rows dequantized as they are looked up).
    """
    directory = Path(directory)
    config = read_draft_config(directory)
    if config.get("kind", "transformer") != "transformer":
        raise ValueError(f"{directory} is a {config['kind']!r} draft, not a standalone transformer: it runs next to "
                         "its target (specdecode generate --draft PATH)")
    state, output_ids = read_draft_weights(directory, "distilled draft")
    native = NativeConfig.from_dict(config["native_config"])
    with torch.device("meta"), skipped_initialization():  # no memory until the weights are assigned
        # model.dtype sizes its KV cache; an int8 embedding stays so: the same rows at a quarter of the memory
        model = build_draft_transformer(native, output_ids.numel(), dtype, int8_embedding="embed.qweight" in state)
    missing = {k for k in model.state_dict() if not k.startswith("rope_")} - set(state)
    if missing:
        raise ValueError(f"distilled draft {directory} lacks tensors {sorted(missing)[:5]}")
    state = {k: v if k in _INT8_EMBEDDING_KEYS else v.to(dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=False, assign=True)
    model.reset_rope_tables()  # buffers off the meta device
    return model.eval().requires_grad_(False), output_ids, config


def widen_logits(logits: torch.Tensor, output_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits [..., K] of the tokens output_ids [K] as logits [..., vocab_size], -inf (q = 0) for every other token."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    full[..., output_ids] = logits
    return full


class ReducedVocabLM:
    """A `LanguageModel` over the full vocabulary V from a model whose head scores only output_ids [K].

    Logits of every other token are -inf, so the draft's q is exactly 0 there.
    """

    def __init__(self, inner: LanguageModel, output_ids: torch.Tensor, vocab_size: int) -> None:
        if output_ids.dim() != 1 or output_ids.numel() == 0:
            raise ValueError("output_ids must be a non-empty 1-D tensor of token ids")
        if int(output_ids.min()) < 0 or int(output_ids.max()) >= vocab_size:
            raise ValueError(f"output_ids must lie in [0, {vocab_size})")
        self.inner = inner
        self.output_ids = output_ids.long()
        self.name = inner.name
        self.vocab_size = vocab_size
        self.max_length = inner.max_length

    def _widen(self, logits: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., V]
        return widen_logits(logits, self.output_ids, self.vocab_size)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self._widen(self.inner.prefill(prompt_ids))

    def extend(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._widen(self.inner.extend(token_ids))

    @property
    def num_generated(self) -> int:
        return self.inner.num_generated

    def rollback(self, num_generated: int) -> None:
        self.inner.rollback(num_generated)

    def room(self) -> int:
        return self.inner.room()


def load_distilled(
    directory: str | Path, max_cache_len: int = 4096, dtype: torch.dtype = torch.float32, **engine_options
) -> LoadedModel:
    """A distilled draft on the native engine, as a LoadedModel (hf_model holds its configs only)."""
    from specdecode.native.loading import NativeModelInfo

    directory = Path(directory)
    model, output_ids, config = load_draft_transformer(directory, dtype)
    name = f"distilled:{directory.name}"
    engine: LanguageModel = NativeLM(model, name=name, max_cache_len=max_cache_len, **engine_options)
    if output_ids.numel() != model.config.vocab_size:
        engine = ReducedVocabLM(engine, output_ids, model.config.vocab_size)
    tokenizer = saved_tokenizer(directory)
    info = NativeModelInfo(None, model.config)
    return LoadedModel(engine, tokenizer, info, str(directory))


def bundled_draft_dir(target: str) -> Path | None:
    """The draft shipped in the package for `target`, or None."""
    folder = _BUNDLED.get(target)
    if folder is None:
        return None
    path = Path(str(resources.files("specdecode") / "drafts" / folder))
    return path if is_distilled_draft(path) else None
