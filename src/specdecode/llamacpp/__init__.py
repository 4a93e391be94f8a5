"""llama.cpp as an engine: GGUF models behind `LanguageModel`, through the llama-cpp-python binding.

    from specdecode.llamacpp import load_llamacpp
    loaded = load_llamacpp()          # the default SmolLM2-135M GGUF on llama.cpp's CPU kernels
    loaded.model.prefill(ids)         # a LlamaCppLM: llama.cpp's KV cache, rollback = removing cells

binding.py  importing llama_cpp on first use (a clear error naming the install command), llama.cpp's log
engine.py   LlamaCppLM, the LanguageModel adapter (one sequence, batched extend, KV-cell rollback)
loading.py  load_llamacpp: a GGUF file (or the default model) with its tokenizer and end-of-sequence ids
"""

from specdecode.llamacpp.binding import INSTALL_COMMAND, llamacpp_available
from specdecode.llamacpp.engine import LlamaCppLM
from specdecode.llamacpp.loading import LlamaCppModelInfo, load_llamacpp

__all__ = ["INSTALL_COMMAND", "LlamaCppLM", "LlamaCppModelInfo", "llamacpp_available", "load_llamacpp"]
