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


def test_auto_runs_on_transformers_what_the_native_engine_cannot(tmp_path):
    """A Llama with a GELU MLP, or with .bin weights: transformers runs both, the native engine neither."""
    import torch
    from safetensors.torch import load_file

    gelu = tiny_llama(seed=2)
    gelu.config.hidden_act = "gelu"
    save_tiny_checkpoint(tmp_path / "gelu", gelu, tiny_tokenizer())
    binary = save_tiny_checkpoint(tmp_path / "bin", tiny_llama(seed=3), tiny_tokenizer())
    torch.save(load_file(binary / "model.safetensors"), binary / "pytorch_model.bin")  # the older weights format
    (binary / "model.safetensors").unlink()
    for name in ("gelu", "bin"):
        assert not backends.native_supports(str(tmp_path / name))
        assert isinstance(backends.load(str(tmp_path / name)).model, HFCausalLM)


def test_native_reads_only_the_checkpoint_files_beside_another_format(checkpoints, tmp_path):
    """A Mistral-style repository also ships consolidated.safetensors (other tensor names): model.safetensors is read."""
    import shutil

    from safetensors.torch import save_file
    import torch

    directory = shutil.copytree(checkpoints["llama"], tmp_path / "llama")
    save_file({"tok_embeddings.weight": torch.zeros(2, 2)}, directory / "consolidated.safetensors")
    assert isinstance(backends.load(str(directory)).model, NativeLM)


def test_a_truncated_gguf_gets_the_loaders_error(tmp_path):
    from native_helpers import write_tiny_gguf

    whole = write_tiny_gguf(tmp_path / "whole.gguf", tiny_llama()).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:200])  # an interrupted download
    with pytest.raises(ValueError, match="not a valid GGUF file"):
        backends.load(str(tmp_path / "cut.gguf"))


def test_bfloat16_weights_on_the_native_engine_and_a_clear_error_elsewhere(checkpoints):
    import torch

    loaded = backends.load(str(checkpoints["llama"]), "native", dtype="bfloat16")
    assert loaded.model.model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
        backends.load(str(checkpoints["llama"]), "native", dtype="float16")
    with pytest.raises(ValueError, match="dtype='bfloat16' is the native engine's"):
        backends.load(str(checkpoints["llama"]), "llamacpp", dtype="bfloat16")
