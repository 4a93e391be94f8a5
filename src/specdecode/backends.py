"""Choosing the engine a model runs on: the native PyTorch engine or Hugging Face transformers."""

from __future__ import annotations

import json
from pathlib import Path

from specdecode.models.loading import DEFAULT_TARGET, LoadedModel, load_model
from specdecode.native.config import PACKINGS, check_packing

__all__ = ["BACKENDS", "PACKINGS", "load", "native_supports"]

BACKENDS = ("auto", "native", "hf")


def native_supports(name_or_path: str) -> bool:
    """Whether the native engine runs this model: the default, a Llama/Qwen2/Mistral GGUF file or HF directory
    whose config and safetensors weights the engine takes."""
    from specdecode.native.config import HF_ARCHITECTURES, NativeConfig
    from specdecode.native.loading import GGUF_ARCHITECTURES, hf_weight_files

    if name_or_path == DEFAULT_TARGET:
        return True
    path = Path(name_or_path)
    if path.suffix == ".gguf":
        return path.is_file() and _gguf_architecture(path) in GGUF_ARCHITECTURES
    config = path / "config.json"
    if not config.is_file():
        return False  # a model id in the HF cache, or nothing: let transformers handle (or refuse) it
    if json.loads(config.read_text()).get("model_type") not in HF_ARCHITECTURES or not hf_weight_files(path):
        return False  # another architecture, or weights in another format (pytorch_model.bin)
    from transformers import AutoConfig

    try:  # a supported model type with a feature the engine lacks (another activation, per-layer RoPE)
        NativeConfig.from_hf_config(AutoConfig.from_pretrained(path, local_files_only=True))
    except ValueError:
        return False
    return True


def _gguf_architecture(path: Path) -> str | None:
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields.get("general.architecture")
    except Exception as error:  # a truncated or foreign file: gguf raises anything (IndexError, struct.error, ...)
        raise ValueError(f"{path} is not a valid GGUF file: {error}") from error
    return None if field is None else bytes(field.parts[field.data[0]]).decode()


def load(name_or_path: str, backend: str = "auto", packing: str = "auto", rows_per_call: int = 1) -> LoadedModel:
    """Load a model on `backend`: 'native', 'hf', or 'auto' (native when supported, else hf).

    packing: the native engine's layout of the linear layers (`specdecode.native.fast`); a packing
    other than 'auto' needs the native engine. rows_per_call: the tokens most calls will feed (gamma + 1
    for a target verifying gamma draft tokens), which 'auto' chooses the layout for (`NativeLM`).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    check_packing(packing)  # before the (slow) load
    if backend == "native" or (backend == "auto" and native_supports(str(name_or_path))):
        from specdecode.native.loading import load_native

        return load_native(name_or_path, packing=packing, rows_per_call=rows_per_call)
    if packing != "auto":
        raise ValueError(f"packing={packing!r} needs the native engine, but {name_or_path} runs on transformers "
                         f"(backend {backend!r})")
    return load_model(name_or_path)
