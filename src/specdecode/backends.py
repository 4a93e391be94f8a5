"""Choosing the engine a model runs on: llama.cpp, the native PyTorch engine, or Hugging Face transformers.

'auto' runs a GGUF file on whichever of llama.cpp and the native engine decodes it faster on this
machine (timed once, one token per call after a short context, and cached like the layout choice);
other models on the native engine where it supports them, else on transformers.
"""

from __future__ import annotations

import gc
import json
import logging
import statistics
import time
from importlib import metadata
from pathlib import Path

import torch

from specdecode.llamacpp.binding import llamacpp_available
from specdecode.models.known import is_known_model
from specdecode.models.loading import LoadedModel, load_model
from specdecode.native.config import PACKINGS, check_packing

__all__ = ["BACKENDS", "DTYPES", "PACKINGS", "load", "check_dtype", "native_supports", "fastest_gguf_engine", "is_gguf"]

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "llamacpp", "native", "hf")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # weights of the native engine and transformers
_ENGINE_CHOICE_VERSION = 1  # bump when how the engines are timed changes
# A GGUF file larger than this is timed on the native engine only once converted for it (the default model's
# 90 MB convert in ~40 s; Qwen2.5-Coder-1.5B's 1.1 GB would take minutes and 7 GB of float32 on disk)
_CONVERT_TO_TIME_UP_TO = 256 << 20


def native_supports(name_or_path: str) -> bool:
    """Whether the native engine runs this model: a known model (`models.known`), a Llama/Qwen2/Mistral GGUF file or HF directory
    whose config and safetensors weights the engine takes."""
    from specdecode.native.config import HF_ARCHITECTURES, NativeConfig
    from specdecode.native.loading import GGUF_ARCHITECTURES, hf_weight_files

    if is_known_model(name_or_path):
        return True  # each is a Llama or Qwen2 GGUF file
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


def is_gguf(name_or_path: str) -> bool:
    """Whether the model is a GGUF file: a known model (`models.known`), or a path ending in .gguf."""
    return is_known_model(name_or_path) or Path(name_or_path).suffix == ".gguf"


def _time_single_tokens(model, reps: int = 16) -> float:
    """Median seconds of one-token extends after a 32-token prompt (the first call untimed)."""
    model.prefill(torch.arange(32) % model.vocab_size)
    times = []
    for rep in range(reps + 1):
        start = time.perf_counter()
        model.extend(torch.tensor([rep % model.vocab_size]))
        if rep:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def fastest_gguf_engine(name_or_path: str, threads: int | None = None, dtype: str = "float32") -> str:
    """'llamacpp' or 'native' (with `dtype` weights): which decodes this GGUF file faster on this machine, timed
    once and cached.

    'native' without timing where the llama-cpp-python binding is not installed; 'llamacpp' without timing for
    a large file the native engine has not converted yet (`_CONVERT_TO_TIME_UP_TO`).
    """
    from specdecode.llamacpp.engine import default_threads
    from specdecode.llamacpp.loading import gguf_path
    from specdecode.native.loading import native_conversion_cached
    from specdecode.timing_cache import cpu_name, read_timing, timing_file, write_timing

    if not llamacpp_available():
        logger.info("the llama.cpp engine is not installed; %s runs on the native engine", name_or_path)
        return "native"
    path = gguf_path(name_or_path)
    stat = path.stat()
    if stat.st_size > _CONVERT_TO_TIME_UP_TO and not native_conversion_cached(path, check_dtype(dtype)):
        logger.warning("%s runs on llama.cpp: timing the native engine would first convert its %.1f GB to %s "
                       "(minutes); after one run with --backend native, 'auto' times both", path.name,
                       stat.st_size / 1e9, dtype)
        return "llamacpp"
    key = {"cpu": cpu_name(), "file": [str(path.resolve()), stat.st_size, stat.st_mtime_ns],
           "threads": threads or default_threads(), "torch_threads": torch.get_num_threads(),
           "torch": torch.__version__, "llama_cpp": metadata.version("llama_cpp_python"),
           "version": _ENGINE_CHOICE_VERSION, **({"dtype": dtype} if dtype != "float32" else {})}
    cache = timing_file("engines", key)
    record = read_timing(cache, key)
    if record is not None:
        return record["engine"]
    from specdecode.llamacpp.loading import load_llamacpp
    from specdecode.native.loading import load_native

    seconds = {}
    for engine, loader in (("llamacpp", lambda: load_llamacpp(path, threads=threads, max_length=256)),
                           ("native", lambda: load_native(path, check_dtype(dtype)))):
        loaded = loader()
        seconds[engine] = _time_single_tokens(loaded.model)
        del loaded
        gc.collect()
    engine = min(seconds, key=seconds.get)
    write_timing(cache, key, {"engine": engine, "seconds_per_token": seconds})
    logger.warning("engine for %s on this machine: %s (one token: %s ms; timed once, cached in %s)", path.name, engine,
                   {name: round(1000 * t, 2) for name, t in seconds.items()}, cache.parent)
    return engine


def check_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a weight type's name, or a ValueError naming the parameter."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def load(name_or_path: str, backend: str = "auto", packing: str = "auto", rows_per_call: int = 1,
         threads: int | None = None, dtype: str = "float32") -> LoadedModel:
    """Load a model on `backend`: 'llamacpp', 'native', 'hf', or 'auto' (a GGUF file on the faster of llama.cpp
    and native here at `dtype`, `fastest_gguf_engine`, unless a packing of the native engine is asked for; other
    models native when supported, else hf).

    packing: the native engine's layout of the linear layers (`specdecode.native.fast`); a packing
    other than 'auto' needs the native engine. rows_per_call: the tokens most calls will feed (gamma + 1
    for a target verifying gamma draft tokens), which 'auto' chooses the layout for (`NativeLM`).
    threads: llama.cpp's threads (default: all cores); the other engines use torch's. dtype: the weights of the
    native engine and transformers ('float32' or 'bfloat16'); llama.cpp runs the GGUF file's own.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    check_packing(packing)  # before the (slow) load
    torch_dtype = check_dtype(dtype)
    name_or_path = str(name_or_path)
    if backend == "auto" and is_gguf(name_or_path) and packing == "auto":
        if native_supports(name_or_path):
            backend = fastest_gguf_engine(name_or_path, threads, dtype)
        elif llamacpp_available():  # an architecture the native engine lacks: llama.cpp runs (or refuses) it
            backend = "llamacpp"
    if backend == "llamacpp":
        if packing != "auto" or dtype != "float32":
            option = f"packing={packing!r}" if packing != "auto" else f"dtype={dtype!r}"
            raise ValueError(f"{option} is the native engine's; the llama.cpp engine runs the GGUF file's own weights")
        from specdecode.llamacpp.loading import load_llamacpp

        return load_llamacpp(name_or_path, threads=threads)
    if backend == "native" or (backend == "auto" and native_supports(name_or_path)):
        from specdecode.native.loading import load_native

        return load_native(name_or_path, torch_dtype, packing=packing, rows_per_call=rows_per_call)
    if packing != "auto":
        raise ValueError(f"packing={packing!r} needs the native engine, but {name_or_path} runs on transformers "
                         f"(backend {backend!r})")
    return load_model(name_or_path, torch_dtype)
