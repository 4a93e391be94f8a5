"""A lean native PyTorch engine for Llama-family models (Llama, Qwen2, Mistral) behind `LanguageModel`.

    from specdecode.native import load_native
    loaded = load_native()            # the default SmolLM2-135M GGUF, read with the gguf package
    loaded.model.prefill(ids)         # a NativeLM: static KV cache, rollback = moving a length

config.py   NativeConfig (from transformers configs or GGUF metadata)
rope.py     RoPE frequencies (default, linear, dynamic, llama3, yarn) and cos/sin tables
model.py    NativeTransformer and its preallocated KVCache
engine.py   NativeLM, the LanguageModel adapter
fast.py     oneDNN-prepacked linear layers, torch.compile
layout.py   packing='auto' for several rows per call: dual or none, whichever is faster here (timed, cached)
quant.py    weight-only int8 (per-channel scales): NativeLM(..., quantize="int8"), load_native(quantize="int8")
loading.py  from a transformers model, a safetensors directory or a GGUF file (cached)
bench.py    `python -m specdecode.native.bench`: speed, T(k)/T(1), agreement, TTFT, RSS against transformers
probe.py    the fresh-process TTFT and RSS measurements bench.py runs
"""

from specdecode.native.config import NativeConfig
from specdecode.native.engine import NativeLM
from specdecode.native.loading import (
    NativeModelInfo,
    load_native,
    native_from_gguf,
    native_from_hf_directory,
    native_from_hf_model,
)
from specdecode.native.model import KVCache, NativeTransformer

__all__ = [
    "NativeConfig",
    "NativeLM",
    "NativeModelInfo",
    "NativeTransformer",
    "KVCache",
    "load_native",
    "native_from_gguf",
    "native_from_hf_directory",
    "native_from_hf_model",
]
