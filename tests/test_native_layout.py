"""packing='auto' with several rows per call: the layout chosen by timing, its disk cache, and unchanged outputs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from specdecode.native import layout
from specdecode.native.config import NativeConfig
from specdecode.native.engine import NativeLM
from specdecode.native.fast import current_packing, packing_available
from specdecode.native.model import NativeTransformer

CONFIG = NativeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=128)

needs_onednn = pytest.mark.skipif(not packing_available(torch.float32), reason="PyTorch without oneDNN float32 packing")


def _model(tied: bool = False, seed: int = 0) -> NativeTransformer:
    model = NativeTransformer(dataclasses.replace(CONFIG, tie_word_embeddings=tied))
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model.eval().requires_grad_(False)


@torch.inference_mode()
def _logits(model: NativeTransformer) -> torch.Tensor:
    """Logits [8, V] of a prefill of 5 tokens, then one token, then two."""
    cache = model.new_cache(16)
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    out = [model(ids[:5], torch.arange(5), cache, end=5), model(ids[5:6], torch.arange(5, 6), cache, end=6),
           model(ids[6:], torch.arange(6, 8), cache, end=8)]
    return torch.cat(out)


def _times(dual: tuple[float, float], none: tuple[float, float], rows: int = 2) -> dict:
    return {"dual": {1: dual[0], rows: dual[1]}, "none": {1: none[0], rows: none[1]}}


def test_pick_takes_the_fastest_verification() -> None:
    assert layout.pick(_times(dual=(30, 49), none=(33, 39)), 2) == "none"
    assert layout.pick(_times(dual=(30, 39), none=(33, 49)), 2) == "dual"


def test_pick_breaks_a_tie_by_the_faster_single_row() -> None:
    # within TIE of each other on 2 rows: the faster single row wins, whichever is a hair faster on 2
    assert layout.pick(_times(dual=(30, 40.5), none=(33, 40.0)), 2) == "dual"
    assert layout.pick(_times(dual=(34, 40.0), none=(33, 40.5)), 2) == "none"
    assert layout.pick(_times(dual=(30, 40 * (1 + 2 * layout.TIE)), none=(33, 40)), 2) == "none"  # not a tie


@needs_onednn
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("winner", ["dual", "none"])
def test_the_chosen_layout_is_installed_and_keeps_the_outputs(monkeypatch, tied: bool, winner: str) -> None:
    reference = _logits(_model(tied))
    monkeypatch.setattr(layout, "pick", lambda seconds, rows: winner)
    model = _model(tied)
    choice = layout.choose_packing(model, 3)
    assert (choice.packing, choice.rows, choice.cached) == (winner, 3, False)
    assert set(choice.seconds) == set(layout.CANDIDATES) and all(set(t) == {1, 3} for t in choice.seconds.values())
    assert all(t > 0 for per_rows in choice.seconds.values() for t in per_rows.values())
    assert current_packing(model) == winner
    ours = _logits(model)
    if winner == "none":  # the very modules it started with
        assert torch.equal(ours, reference)
    else:
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_a_timed_choice_is_read_back_from_the_cache_without_timing(monkeypatch) -> None:
    first = layout.choose_packing(_model(), 2)

    def no_timing(*args, **kwargs):
        raise AssertionError("timed again although the choice is cached")

    monkeypatch.setattr(layout, "time_layouts", no_timing)
    model = _model(seed=1)  # other values, the same shape: the same timing
    again = layout.choose_packing(model, 2)
    assert again.cached and (again.packing, again.rows, again.seconds) == (first.packing, 2, first.seconds)
    assert current_packing(model) == first.packing


@needs_onednn
def test_the_cache_key_separates_rows_threads_and_shapes(monkeypatch) -> None:
    model = _model()
    files = {layout._cache_file(layout._key(model, 2)), layout._cache_file(layout._key(model, 3)),
             layout._cache_file(layout._key(_model(tied=True), 2))}
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        files.add(layout._cache_file(layout._key(model, 2)))
    finally:
        torch.set_num_threads(threads)
    assert len(files) == 4


@needs_onednn
def test_an_unreadable_cache_file_is_timed_again_and_replaced(caplog) -> None:
    model = _model()
    path = layout._cache_file(layout._key(model, 2))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    choice = layout.choose_packing(model, 2)
    assert not choice.cached and "ignoring the cache file" in caplog.text
    assert json.loads(path.read_text())["packing"] == choice.packing


def test_choose_packing_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="rows must be an integer >= 2"):
        layout.choose_packing(_model(), 1)
    packed = _model()
    if packing_available(torch.float32):
        NativeLM(packed, packing="packed")
        with pytest.raises(ValueError, match="needs a plain model"):
            layout.time_layouts(packed, 2)


@needs_onednn
def test_native_lm_times_the_layouts_only_for_several_rows_and_packing_auto() -> None:
    one = NativeLM(_model(), rows_per_call=1)
    assert (one.packing, one.layout_choice) == ("dual", None)  # the fastest single row, untimed
    several = NativeLM(_model(), rows_per_call=3)
    assert several.layout_choice is not None and several.layout_choice.rows == 3
    assert several.packing == several.layout_choice.packing == current_packing(several.model)
    fixed = NativeLM(_model(), packing="none", rows_per_call=3)
    assert (fixed.packing, fixed.layout_choice) == ("none", None)
    int8 = NativeLM(_model(), quantize="int8", rows_per_call=3)
    assert (int8.packing, int8.layout_choice) == ("none", None)


@pytest.mark.parametrize("rows", [0, -1, 1.5, True, "2"])
def test_native_lm_refuses_bad_rows_per_call(rows) -> None:
    with pytest.raises(ValueError, match="rows_per_call must be an integer >= 1"):
        NativeLM(_model(), rows_per_call=rows)


def test_a_layout_choice_reads_as_json() -> None:
    choice = layout.LayoutChoice("none", 2, {"dual": {1: 0.03, 2: 0.05}, "none": {1: 0.031, 2: 0.033}})
    assert json.loads(json.dumps(choice.to_dict()))["seconds"]["none"] == {"1": 0.031, "2": 0.033}


@needs_onednn
def test_rows_are_capped_by_the_context_window() -> None:
    short = NativeTransformer(dataclasses.replace(CONFIG, max_position_embeddings=4))
    engine = NativeLM(short, rows_per_call=8)  # no call can feed more than 3 tokens after a first one
    assert engine.layout_choice.rows == 3
