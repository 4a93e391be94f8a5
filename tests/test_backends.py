"""Backend choice: the native engine where it supports the model, transformers otherwise."""

import pytest
from tiny_hf import save_tiny_checkpoint, tiny_llama, tiny_t5, tiny_tokenizer

from specdecode import backends
from specdecode.models.hf import HFCausalLM, HFSeq2SeqLM
from specdecode.native import NativeLM


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("backends")
    tokenizer = tiny_tokenizer()
    return {
        "llama": save_tiny_checkpoint(root / "llama", tiny_llama(seed=0), tokenizer),
        "t5": save_tiny_checkpoint(root / "t5", tiny_t5(seed=1), tokenizer),
    }


def test_auto_picks_native_for_llama_and_hf_for_t5(checkpoints):
    assert backends.native_supports(str(checkpoints["llama"]))
    assert not backends.native_supports(str(checkpoints["t5"]))
    assert isinstance(backends.load(str(checkpoints["llama"])).model, NativeLM)
    assert isinstance(backends.load(str(checkpoints["t5"])).model, HFSeq2SeqLM)


def test_hf_backend_can_be_forced(checkpoints):
    assert isinstance(backends.load(str(checkpoints["llama"]), "hf").model, HFCausalLM)


def test_native_backend_refuses_an_unsupported_model(checkpoints):
    with pytest.raises(ValueError, match="t5"):
        backends.load(str(checkpoints["t5"]), "native")


def test_unknown_backend_names_the_parameter():
    with pytest.raises(ValueError, match="backend"):
        backends.load("anything", "tpu")


def test_packing_reaches_the_native_engine(checkpoints):
    assert backends.load(str(checkpoints["llama"]), packing="none").model.packing == "none"


def test_packing_is_checked_and_needs_the_native_engine(checkpoints):
    with pytest.raises(ValueError, match="packing"):
        backends.load(str(checkpoints["llama"]), packing="fast")
    with pytest.raises(ValueError, match="packing='none' needs the native engine"):
        backends.load(str(checkpoints["llama"]), "hf", packing="none")
