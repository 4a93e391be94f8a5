"""The table of model pairs: what `--draft auto` means per target and engine, as data."""

from __future__ import annotations

import pytest
from tiny_hf import WORDS, save_tiny_checkpoint, tiny_llama, tiny_tokenizer

from specdecode import backends, pairs
from specdecode.drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from specdecode.models.compat import IncompatibleVocabularyError
from specdecode.pairs import FALLBACK, DraftDefaults, auto_draft
from specdecode.pipeline import Pipeline, auto_entry, make_drafter


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    return {
        "target": save_tiny_checkpoint(root / "target", tiny_llama(seed=0), tiny_tokenizer()),
        "draft": save_tiny_checkpoint(root / "draft", tiny_llama(seed=1), tiny_tokenizer()),
        "other": save_tiny_checkpoint(root / "other", tiny_llama(seed=2),
                                      tiny_tokenizer(list(reversed(WORDS)))),  # the same words under other ids
    }


def test_a_target_without_an_entry_gets_prompt_lookup(checkpoints):
    assert auto_draft(str(checkpoints["target"]), "native") == FALLBACK and FALLBACK.draft == "ngram"
    target = backends.load(str(checkpoints["target"]), "native")
    assert isinstance(make_drafter("auto", target), PromptLookupDrafter)


def test_an_entry_gives_the_draft_gamma_and_early_end_on_its_engines(checkpoints, monkeypatch):
    entry = DraftDefaults(f"{checkpoints['draft']}+ngram", gamma=3, min_confidence=0.25, engines=("native",))
    monkeypatch.setitem(pairs.PAIRS, str(checkpoints["target"]), (entry,))
    assert auto_draft(str(checkpoints["target"]), "native") == entry
    assert auto_draft(str(checkpoints["target"]), "hf") == FALLBACK  # an engine the entry does not list
    pipeline = Pipeline.load(str(checkpoints["target"]), backend="native")
    assert pipeline.gamma == 3 and isinstance(pipeline.drafter, LookupThenModelDrafter)
    assert isinstance(pipeline.drafter.model, ModelDrafter) and pipeline.drafter.model.min_confidence == 0.25
    assert pipeline.costs is not None  # 'auto' without a gamma: cost-aware draft lengths
    assert Pipeline.load(str(checkpoints["target"]), gamma=2, backend="native").gamma == 2  # an explicit gamma wins


def test_an_entry_whose_draft_has_another_tokenizer_is_refused(checkpoints, monkeypatch):
    monkeypatch.setitem(pairs.PAIRS, str(checkpoints["target"]), (DraftDefaults(str(checkpoints["other"])),))
    target = backends.load(str(checkpoints["target"]), "native")
    with pytest.raises(IncompatibleVocabularyError, match="different ids"):
        make_drafter("auto", target)


def test_the_default_targets_entries():
    assert auto_draft("smollm2-135m-instruct", "native").draft == "bundled+ngram"
    assert auto_draft("smollm2-135m-instruct", "llamacpp") == FALLBACK  # its EAGLE draft is slow there
    qwen = auto_draft("qwen2.5-coder-1.5b-instruct", "native")
    assert qwen.draft.removesuffix("+ngram") == "qwen2.5-coder-0.5b-instruct" and qwen.draft_backend == "auto"
    assert auto_entry("auto", "qwen2.5-coder-1.5b-instruct") == qwen
    assert auto_entry("ngram", "qwen2.5-coder-1.5b-instruct") is None  # not 'auto': the global defaults
    with pytest.raises(ValueError, match="engine"):
        auto_draft("smollm2-135m-instruct", "gpu")
    with pytest.raises(ValueError, match="engines"):
        DraftDefaults("ngram", engines=("tpu",))
