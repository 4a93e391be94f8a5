"""Shared fixtures. Tests never download: tiny models are built from configs with random weights."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for `mock_models`

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside. A module-scoped fixture whose results a test compares bit
    for bit with its own runs uses one thread as the tests do: MKL's float sums change with the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def one_torch_thread(request) -> Iterator[None]:
    """Tiny models and tables run ~10x faster on one thread (thread start-up dominates on 2 cores).

    Tests of the real model (marked `real_model`) keep all threads.
    """
    if request.node.get_closest_marker("real_model"):
        yield
        return
    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def private_layout_cache(request, tmp_path_factory, monkeypatch) -> None:
    """Timed layout choices (`specdecode.native.layout`) go to a directory of this test, not the user's cache."""
    from specdecode.native import layout

    test = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]  # created only when a choice is cached
    directory = tmp_path_factory.getbasetemp() / "layouts" / test
    monkeypatch.setattr(layout, "layout_cache_dir", lambda: directory)


@pytest.fixture(autouse=True)
def private_timing_cache(request, tmp_path_factory, monkeypatch) -> None:
    """Timed costs and engine choices (`specdecode.timing_cache`) go to a directory of this test, not the user's cache."""
    from specdecode import timing_cache

    test = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setattr(timing_cache, "timing_root", lambda: tmp_path_factory.getbasetemp() / "timings" / test)
