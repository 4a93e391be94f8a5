"""The llama-cpp-python binding: imported on first use, with llama.cpp's own log kept out of the terminal.

llama.cpp prints hundreds of lines while it loads a model. They go to the `specdecode.llamacpp`
logger at debug level instead; the last error lines are kept so that a failed load can say why.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import logging
from types import ModuleType

__all__ = ["INSTALL_COMMAND", "llamacpp_available", "llama_cpp", "recent_errors"]

logger = logging.getLogger("specdecode.llamacpp")

# llama-cpp-python is source only on PyPI; this script builds it for the machine (about 1.5 min on 2 cores)
INSTALL_COMMAND = "make setup (or: bash scripts/install_llama_cpp.sh .venv/bin/python)"

_GGML_LOG_LEVEL_ERROR = 4  # enum ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_errors: collections.deque[str] = collections.deque(maxlen=8)
_callback = None  # llama.cpp keeps the pointer: the ctypes callback must outlive every call


def llamacpp_available() -> bool:
    """Whether the llama-cpp-python binding is installed (without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def _log(level: int, text: bytes, _user_data) -> None:
    line = text.decode("utf-8", errors="replace").rstrip()
    if line:
        if level == _GGML_LOG_LEVEL_ERROR:
            _errors.append(line)
        logger.debug("%s", line)


@functools.cache
def llama_cpp() -> ModuleType:
    """The `llama_cpp` module, initialised once; ImportError naming the install command when it is missing."""
    if not llamacpp_available():
        raise ImportError(f"the llama.cpp engine needs the llama-cpp-python binding: {INSTALL_COMMAND}")
    import llama_cpp as binding

    global _callback
    _callback = binding.llama_log_callback(_log)
    binding.llama_log_set(_callback, None)
    binding.llama_backend_init()
    return binding


def recent_errors() -> list[str]:
    """llama.cpp's last error lines (for an error message), oldest first; cleared by the call."""
    lines = list(_errors)
    _errors.clear()
    return lines
