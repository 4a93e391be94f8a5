"""Weights for the native engine: from a loaded `transformers` model, a safetensors directory, or a GGUF file.

Every source is first brought to Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight,
...), then `native_state_dict` fuses q/k/v and gate/up into the native layout. GGUF files are
read with the `gguf` package directly (no transformers model is built); the dequantized
weights are cached on disk as safetensors, so only the first load pays for the conversion.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdecode.models.known import is_known_model, known_gguf_path
from specdecode.models.loading import DEFAULT_TARGET, LoadedModel, cache_root
from specdecode.models.tokenizer import load_saved_tokenizer
from specdecode.native.config import NativeConfig
from specdecode.native.engine import DEFAULT_MAX_CACHE_LEN, NativeLM
from specdecode.native.model import NativeTransformer, skipped_initialization

if TYPE_CHECKING:  # transformers is imported where it is used: its import costs seconds of start-up
    from transformers import GenerationConfig, PreTrainedModel

__all__ = [
    "NativeModelInfo",
    "load_native",
    "native_from_hf_model",
    "native_from_hf_directory",
    "native_from_gguf",
    "gguf_tokenizer",
    "read_gguf",
    "native_state_dict",
    "native_conversion_cached",
    "unpermute_rope",
]

logger = logging.getLogger(__name__)

_CACHE_VERSION = 1  # bump when the cached layout changes
_CACHE_COMPLETE = "specdecode-native-complete.json"
GGUF_ARCHITECTURES = ("llama", "qwen2")  # llama.cpp writes Mistral as 'llama' too

_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass
class NativeModelInfo:
    """Stands in for `LoadedModel.hf_model`: its transformers config and generation_config (no weights, no generate).

    hf_config / hf_generation_config None: `config` / `generation_config` are made from
    native_config on first use (importing transformers costs seconds of start-up that generation
    never needs); `eos_token_id` answers without building either.
    """

    hf_config: object | None  # a transformers LlamaConfig / Qwen2Config / MistralConfig
    native_config: NativeConfig
    hf_generation_config: GenerationConfig | None = None

    @property
    def config(self):
        if self.hf_config is None:
            self.hf_config = self.native_config.to_hf_config()
        return self.hf_config

    @property
    def generation_config(self) -> GenerationConfig:
        if self.hf_generation_config is None:
            self.hf_generation_config = _generation_config(self.native_config)
        return self.hf_generation_config

    @property
    def eos_token_id(self) -> int | list[int] | None:
        """The generation config's eos_token_id (native_config's while none was loaded from a file)."""
        if self.hf_generation_config is not None:
            return self.hf_generation_config.eos_token_id
        return self.native_config.eos_token_id


def end_of_sequence_ids(hf_model, tokenizer) -> set[int]:
    """End-of-sequence ids of a `LoadedModel.hf_model` (transformers model or NativeModelInfo) and its tokenizer."""
    from specdecode.llamacpp.loading import LlamaCppModelInfo

    # these answer without building a transformers GenerationConfig (seconds of imports)
    lean = isinstance(hf_model, (NativeModelInfo, LlamaCppModelInfo))
    generation_eos = hf_model.eos_token_id if lean else hf_model.generation_config.eos_token_id
    ids: set[int] = set()
    for value in (generation_eos, tokenizer.eos_token_id):
        if value is not None:
            ids.update(value if isinstance(value, list) else [value])
    return ids


# --------------------------------------------------------------------------- HF names -> native layout


class LazyTensors(Mapping[str, torch.Tensor]):
    """Tensors made one at a time when looked up (dequantized, read, fused), so that loading never holds a whole
    model twice: `_build` copies each into the model and drops it. Names are known without making anything."""

    def __init__(self, makers: Mapping[str, Callable[[], torch.Tensor]]) -> None:
        self._makers = dict(makers)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._makers[name]()

    def __contains__(self, name: object) -> bool:
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def native_state_dict(hf_state: Mapping[str, torch.Tensor], config: NativeConfig) -> LazyTensors:
    """Rename and fuse a Llama/Qwen2-style state dict into `NativeTransformer` parameter names (each tensor made,
    and q/k/v and gate/up fused, only when looked up)."""

    used: set[str] = set()

    def get(name: str) -> Callable[[], torch.Tensor]:
        if name not in hf_state:
            raise ValueError(f"the checkpoint has no tensor {name!r} (expected for {config.architecture})")
        used.add(name)
        return lambda: hf_state[name]

    def cat(*names: str) -> Callable[[], torch.Tensor]:
        parts = [get(name) for name in names]
        return lambda: torch.cat([part() for part in parts])

    out = {"embed.weight": get("model.embed_tokens.weight"), "norm.weight": get("model.norm.weight")}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = get("lm_head.weight")
    for i in range(config.num_layers):
        hf, nat = f"model.layers.{i}.", f"layers.{i}."
        attn, mlp = hf + "self_attn.", hf + "mlp."
        out[nat + "attn_norm.weight"] = get(hf + "input_layernorm.weight")
        out[nat + "mlp_norm.weight"] = get(hf + "post_attention_layernorm.weight")
        out[nat + "qkv.weight"] = cat(*(f"{attn}{p}_proj.weight" for p in "qkv"))
        out[nat + "o.weight"] = get(attn + "o_proj.weight")
        out[nat + "gate_up.weight"] = cat(mlp + "gate_proj.weight", mlp + "up_proj.weight")
        out[nat + "down.weight"] = get(mlp + "down_proj.weight")
        if config.attention_bias:
            out[nat + "qkv.bias"] = cat(*(f"{attn}{p}_proj.bias" for p in "qkv"))
        if config.attention_out_bias:
            out[nat + "o.bias"] = get(attn + "o_proj.bias")
        if config.mlp_bias:
            out[nat + "gate_up.bias"] = cat(mlp + "gate_proj.bias", mlp + "up_proj.bias")
            out[nat + "down.bias"] = get(mlp + "down_proj.bias")
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unused = sorted(name for name in hf_state if name not in used and name not in ignorable and "rotary" not in name)
    if unused:  # e.g. biases the config does not declare: refuse rather than silently run another model
        raise ValueError(f"the checkpoint has tensors the {config.architecture} config does not use: {unused[:5]}")
    return LazyTensors(out)


def _build(config: NativeConfig, state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> NativeTransformer:
    """A NativeTransformer holding `state` (native names), cast to dtype."""
    with torch.device("meta"), skipped_initialization():
        model = NativeTransformer(config, dtype)
    expected = {name: p.shape for name, p in model.named_parameters(remove_duplicate=True)}
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"unexpected tensors for {config.architecture}: {unexpected[:5]}")
    missing = [name for name in expected if name not in state]
    if missing:
        raise ValueError(f"the checkpoint has no tensor for {missing[0]!r}")
    # One tensor at a time (a LazyTensors state makes each on lookup), into own copies: tensors read from
    # safetensors map the whole file, and one kept tensor (a norm) would keep all of it resident after packing or
    # quantization replaced the rest
    tensors = {}
    for name, shape in expected.items():
        source = state[name]
        if tuple(source.shape) != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(source.shape)}, expected {tuple(shape)}")
        tensors[name] = torch.empty(shape, dtype=dtype).copy_(source)
        del source
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.reset_rope_tables()  # buffers off the meta device
    return model.eval().requires_grad_(False)


def native_from_hf_model(model: PreTrainedModel, dtype: torch.dtype | None = None) -> NativeTransformer:
    """The native twin of a loaded Llama / Qwen2 / Mistral `transformers` model (weights copied)."""
    config = NativeConfig.from_hf_config(model.config)
    dtype = dtype or next(model.parameters()).dtype
    state = {name: t.detach().cpu() for name, t in model.state_dict().items()}  # _build copies them
    return _build(config, native_state_dict(state, config), dtype)


def hf_weight_files(path: Path) -> list[Path]:
    """The safetensors files of a Hugging Face checkpoint directory: those its index lists, else model.safetensors,
    else every *.safetensors file (none: []). Other files beside an index (e.g. a consolidated.safetensors of another
    format) are not read."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = path / "model.safetensors"
    return [single] if single.is_file() else sorted(path.glob("*.safetensors"))


def native_from_hf_directory(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> NativeTransformer:
    """From a Hugging Face checkpoint directory: config.json and one or more *.safetensors files."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    files = hf_weight_files(path)
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    from transformers import AutoConfig

    config = NativeConfig.from_hf_config(AutoConfig.from_pretrained(path, local_files_only=True))
    state = _safetensors(files)  # a tied checkpoint's lm_head.weight, if saved, is not read
    return _build(config, native_state_dict(state, config), dtype)


def _safetensors(files: Sequence[Path]) -> LazyTensors:
    """The tensors of safetensors files, each read when looked up. Each read opens the file anew: an open file
    keeps every page read through it resident, which would hold the whole checkpoint beside its copy."""
    makers = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            makers.update({name: functools.partial(_read_tensor, file, name) for name in handle.keys()})
    return LazyTensors(makers)


def _read_tensor(file: Path, name: str) -> torch.Tensor:
    with safe_open(file, framework="pt") as handle:
        return handle.get_tensor(name)


# --------------------------------------------------------------------------- GGUF


def unpermute_rope(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation (interleaved pairs -> rotate-half halves), as transformers does.

    llama.cpp: w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2); this is its inverse.
    Works for weights [rows, in] and biases [rows].
    """
    half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, half, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def _field(reader, key: str, default=None):
    """A metadata value (scalar or string); arrays, e.g. per-layer head counts, are refused."""
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    if isinstance(value, list) and not key.startswith("tokenizer."):
        raise ValueError(f"GGUF metadata {key} is an array; per-layer values are not supported")
    return value


def _gguf_config(reader, arch: str, vocab_size: int, tie: bool, biases: dict[str, bool]) -> NativeConfig:
    def need(key: str):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", 0) or hidden // heads)
    rope_dim = _field(reader, f"{arch}.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise ValueError(f"partial rotary embeddings (rope.dimension_count {rope_dim} != head_dim {head_dim}) "
                         "are not supported")
    rope_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    scaling: dict | None = None
    if rope_type == "linear":
        scaling = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif rope_type != "none":  # llama.cpp's yarn differs in details from transformers'; not verified here
        raise ValueError(f"GGUF RoPE scaling {rope_type!r} is not supported (only linear)")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    return NativeConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings=tie,
        **biases,
        max_position_embeddings=int(need("context_length")),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        architecture=arch,
        extra={"name": str(_field(reader, "general.name", ""))},
    )


def _hf_name(gguf_name: str) -> str | None:
    """token_embd.weight -> model.embed_tokens.weight, blk.3.attn_q.bias -> model.layers.3.self_attn.q_proj.bias."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GGUF_GLOBAL_NAMES:
        return f"{_GGUF_GLOBAL_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _GGUF_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_BLOCK_NAMES[parts[2]]}.{kind}"
    return None


def read_gguf(path: str | os.PathLike) -> tuple[NativeConfig, LazyTensors]:
    """Parse a GGUF file: its config and its float32 tensors under Hugging Face names, each dequantized when looked
    up (`LazyTensors`)."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        reader = GGUFReader(path)
        arch = _field(reader, "general.architecture")
    except Exception as error:  # bad magic, truncated header, nonsense counts...
        raise ValueError(f"{path} is not a valid GGUF file: {error}") from error
    if arch is None:
        raise ValueError(f"{path}: GGUF metadata lacks general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        supported = ", ".join(GGUF_ARCHITECTURES)
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (native engine: {supported})")

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path}: GGUF file has no token_embd.weight")
    unknown = sorted(name for name in tensors if _hf_name(name) is None)
    if unknown:  # refuse rather than run a different model
        hint = ""
        if "rope_freqs.weight" in unknown:  # transformers' GGUF loader drops these factors too: no backend runs it
            hint = ("; rope_freqs.weight holds Llama 3.1-style RoPE frequency factors: load the model's safetensors "
                    "checkpoint instead, whose config.json names its rope scaling")
        raise ValueError(f"{path}: unsupported GGUF tensors {unknown[:5]}{hint}")
    vocab_size = int(tensors["token_embd.weight"].shape[-1])
    biases = {
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "attention_out_bias": "blk.0.attn_output.bias" in tensors,
        "mlp_bias": "blk.0.ffn_down.bias" in tensors,
    }
    config = _gguf_config(reader, arch, vocab_size, tie="output.weight" not in tensors, biases=biases)
    makers = {_hf_name(name): _dequantizer(path, tensor, arch, config) for name, tensor in tensors.items()}
    return config, LazyTensors(makers)


_DEQUANTIZE_ROWS = 4096  # rows dequantized at a time: the temporaries stay small beside a 150k-row embedding


def _dequantizer(path: Path, tensor, arch: str, config: NativeConfig) -> Callable[[], torch.Tensor]:
    """Makes the float32 tensor of one GGUF tensor: its bytes read from the file (not through the reader's memory
    map, whose pages would stay resident), dequantized a block of rows at a time, q/k unpermuted for llama."""
    from gguf.quants import dequantize

    def make() -> torch.Tensor:
        shape = [int(d) for d in reversed(tensor.shape)]  # GGUF lists dims innermost first
        try:
            raw = np.fromfile(path, dtype=np.uint8, count=int(tensor.n_bytes), offset=int(tensor.data_offset))
            raw = raw.view(tensor.data.dtype).reshape(tensor.data.shape)
            rows = raw.reshape(-1, raw.shape[-1]) if raw.ndim > 1 else raw.reshape(1, -1)
            out = np.empty((rows.shape[0], int(np.prod(shape)) // rows.shape[0]), dtype=np.float32)
            for start in range(0, rows.shape[0], _DEQUANTIZE_ROWS):
                block = rows[start:start + _DEQUANTIZE_ROWS]
                out[start:start + len(block)] = dequantize(block, tensor.tensor_type).reshape(len(block), -1)
        except (ValueError, IndexError, NotImplementedError) as error:
            raise ValueError(f"{path}: cannot read GGUF tensor data ({error})") from error
        weights = out.reshape(shape)
        if arch == "llama" and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
            weights = unpermute_rope(weights, config.num_heads if ".attn_q." in tensor.name else config.num_kv_heads)
        return torch.from_numpy(np.ascontiguousarray(weights))

    return make


def _gguf_cache_dir(path: Path, dtype: torch.dtype) -> Path:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}|v{_CACHE_VERSION}"
    return cache_root() / "native" / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def native_conversion_cached(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> bool:
    """Whether the GGUF file's conversion for the native engine is in the cache (a load then takes seconds)."""
    return (_gguf_cache_dir(Path(path), dtype) / _CACHE_COMPLETE).is_file()


def _gguf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as error:  # a GGUF file without (usable) tokenizer metadata
        logger.warning("no tokenizer in %s (%s): text prompts are unavailable", path.name, error)
        return None


def native_from_gguf(
    path: str | os.PathLike, dtype: torch.dtype = torch.float32, *, with_tokenizer: bool = True
) -> tuple[NativeTransformer, object | None]:
    """The model (and tokenizer) of a GGUF file; the first call converts and caches, later ones read the cache."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    cached = _gguf_cache_dir(path, dtype)
    if (cached / _CACHE_COMPLETE).is_file():
        config = NativeConfig.from_dict(json.loads((cached / "native_config.json").read_text()))
        model = _build(config, _safetensors([cached / "model.safetensors"]), dtype)
        return model, (_cached_tokenizer(cached, path) if with_tokenizer else None)

    config, hf_state = read_gguf(path)
    model = _build(config, native_state_dict(hf_state, config), dtype)
    tokenizer = _gguf_tokenizer(path) if with_tokenizer else None
    tokenizer_state = "skipped" if not with_tokenizer else ("saved" if tokenizer is not None else "absent")
    _save_cache(cached, model, tokenizer, source=path, dtype=dtype, tokenizer_state=tokenizer_state)
    return model, tokenizer


def gguf_tokenizer(path: str | os.PathLike):
    """The tokenizer of a GGUF file (None when it has none), converted by transformers once and kept in
    <cache root>/tokenizers, for engines that run the file itself (llama.cpp) and need no converted weights."""
    path = Path(path)
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_root() / "tokenizers" / f"{path.stem}-{key}"
    if (cached / "tokenizer_config.json").is_file():
        return load_saved_tokenizer(cached)
    tokenizer = _gguf_tokenizer(path)
    if tokenizer is not None:
        try:
            cached.mkdir(parents=True, exist_ok=True)
            _add_tokenizer(cached, tokenizer)
        except OSError as error:  # a read-only or full cache only costs speed
            logger.warning("cannot cache the tokenizer of %s in %s: %s", path.name, cached, error)
    return tokenizer


def _cached_tokenizer(cached: Path, source: Path):
    """The tokenizer saved with a converted model; one converted with_tokenizer=False gets it added now."""
    if (cached / "tokenizer_config.json").is_file():
        return load_saved_tokenizer(cached)  # a LeanTokenizer: no transformers import
    marker = json.loads((cached / _CACHE_COMPLETE).read_text())
    if marker.get("tokenizer") == "absent":
        return None  # the GGUF file has none
    tokenizer = _gguf_tokenizer(source)
    try:
        if tokenizer is not None:
            _add_tokenizer(cached, tokenizer)
        else:
            (cached / _CACHE_COMPLETE).write_text(json.dumps({**marker, "tokenizer": "absent"}))
    except OSError as error:  # a read-only or full cache only costs speed
        logger.warning("cannot record the tokenizer in the cache in %s: %s", cached, error)
    return tokenizer


def _add_tokenizer(cached: Path, tokenizer) -> None:
    """Save tokenizer's files beside a cached model: written elsewhere first, then moved in with tokenizer_config.json
    last, whose presence says the tokenizer is there (a write that fails part-way leaves the cache as it was)."""
    staging = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tokenizer-"))
    try:
        tokenizer.save_pretrained(staging)
        for file in sorted(staging.iterdir(), key=lambda f: f.name == "tokenizer_config.json"):
            os.replace(file, cached / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _save_cache(
    cached: Path, model: NativeTransformer, tokenizer, source: Path, dtype: torch.dtype, tokenizer_state: str
) -> None:
    """Write the converted model atomically (staging directory, then rename); failures only cost speed."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".staging-"))
    except OSError as error:
        logger.warning("cannot cache the converted model in %s: %s", cached, error)
        return
    try:
        state = {name: t.contiguous() for name, t in model.state_dict().items() if not name.startswith("rope_")}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, staging / "model.safetensors")
        (staging / "native_config.json").write_text(json.dumps(model.config.to_dict()))
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        (staging / _CACHE_COMPLETE).write_text(json.dumps(
            {"source": str(source), "dtype": str(dtype), "tokenizer": tokenizer_state}
        ))
        if cached.exists():  # an interrupted earlier conversion
            shutil.rmtree(cached)
        staging.rename(cached)
    except OSError as error:
        logger.warning("cannot cache the converted model in %s: %s", cached, error)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --------------------------------------------------------------------------- entry point


def _generation_config(config: NativeConfig, directory: Path | None = None) -> GenerationConfig:
    from transformers import GenerationConfig

    if directory is not None and (directory / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(directory)
    return GenerationConfig(eos_token_id=config.eos_token_id, bos_token_id=config.bos_token_id)


def _local_directory(source: str) -> Path:
    path = Path(source)
    if path.is_dir():
        return path
    try:  # a model id already in the local Hugging Face cache; never download
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, local_files_only=True))
    except Exception as error:
        raise FileNotFoundError(
            f"model not found: {source} is neither a local model directory nor in the local Hugging Face cache "
            f"(specdecode never downloads): {error}"
        ) from error


def load_native(
    name_or_path: str | os.PathLike = DEFAULT_TARGET,
    dtype: torch.dtype = torch.float32,
    max_cache_len: int = DEFAULT_MAX_CACHE_LEN,
    *,
    quantize: str = "none",
    **engine_options,
) -> LoadedModel:
    """Like `specdecode.models.loading.load_model`, on the native engine.

    Takes a known model's name (`models.known`), a `.gguf` file or a Hugging Face directory (or cached model id).
    `hf_model` of the result is a `NativeModelInfo` (transformers config and generation_config, no weights).
    quantize='int8' stores the weights as int8 with per-channel scales (`specdecode.native.quant`);
    the other engine_options go to `NativeLM` (packing=..., rows_per_call=..., compile=...).
    """
    from specdecode.native.quant import check_quantize

    check_quantize(quantize)  # before the (slow) load
    source = str(name_or_path)
    if is_known_model(source) or source.endswith(".gguf"):
        path = known_gguf_path(source) if is_known_model(source) else Path(source)
        model, tokenizer = native_from_gguf(path, dtype)
        info = NativeModelInfo(None, model.config)
    else:
        from transformers import AutoConfig, AutoTokenizer

        directory = _local_directory(source)
        model = native_from_hf_directory(directory, dtype)
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as error:
            logger.warning("no tokenizer for %s (%s): text prompts are unavailable", source, error)
            tokenizer = None
        hf_config = AutoConfig.from_pretrained(directory, local_files_only=True)
        info = NativeModelInfo(hf_config, model.config, _generation_config(model.config, directory))
    engine = NativeLM(model, name=source, max_cache_len=max_cache_len, quantize=quantize, **engine_options)
    return LoadedModel(engine, tokenizer, info, source)
