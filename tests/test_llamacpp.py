"""The llama.cpp engine (`--backend llamacpp`): the LanguageModel protocol on tiny GGUF files, its errors,
the fastest-engine choice, and greedy identity on the real default model."""

from __future__ import annotations

import json

import pytest
import torch
from native_helpers import tiny_llama_variant, write_tiny_gguf
from tiny_hf import SPECIALS, WORDS

from specdecode import backends
from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters import PromptLookupDrafter
from specdecode.llamacpp import INSTALL_COMMAND, LlamaCppLM, load_llamacpp
from specdecode.llamacpp import binding
from specdecode.models.base import ContextLengthError
from specdecode.native import NativeLM
from specdecode.native.loading import load_native

PROMPT = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10])


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    model = tiny_llama_variant(seed=2)
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model, vocabulary=SPECIALS + WORDS)
    return path, model


@pytest.fixture(scope="module")
def tiny_lm(tiny_gguf):
    return LlamaCppLM(tiny_gguf[0], max_length=128, threads=1)


def test_prefill_matches_transformers_on_the_same_weights(tiny_gguf, tiny_lm):
    _, hf = tiny_gguf
    logits = tiny_lm.prefill(PROMPT)  # [V]
    with torch.no_grad():
        expected = hf(PROMPT[None]).logits[0, -1]
    assert logits.shape == (64,) and tiny_lm.vocab_size == 64
    assert torch.allclose(logits, expected, atol=2e-2), (logits - expected).abs().max()  # llama.cpp's f16 KV cache


def test_extend_of_k_tokens_equals_k_single_calls(tiny_lm):
    feed = torch.tensor([11, 12, 13, 14, 15])
    tiny_lm.prefill(PROMPT)
    batched = tiny_lm.extend(feed)  # [5, V]
    tiny_lm.prefill(PROMPT)
    single = torch.stack([tiny_lm.extend(feed[i:i + 1])[0] for i in range(len(feed))])
    assert batched.shape == (5, 64) and tiny_lm.num_generated == 5
    assert torch.allclose(batched, single, atol=1e-4), (batched - single).abs().max()


def test_rollback_then_extend_equals_a_fresh_prefill(tiny_lm):
    tiny_lm.prefill(PROMPT)
    tiny_lm.extend(torch.tensor([20, 21, 22, 23]))
    tiny_lm.rollback(1)  # keep 20; forget 21 22 23
    assert tiny_lm.num_generated == 1 and tiny_lm.room() == 128 - len(PROMPT) - 1
    after_rollback = tiny_lm.extend(torch.tensor([30, 31]))
    fresh = tiny_lm.prefill(torch.cat([PROMPT, torch.tensor([20, 30])]))
    assert torch.allclose(after_rollback[0], fresh, atol=1e-4)
    with pytest.raises(ValueError, match="num_generated must be in"):
        tiny_lm.rollback(5)


def test_llamacpp_and_native_engines_agree_on_a_gguf_file(tiny_gguf, tiny_lm):
    native = load_native(tiny_gguf[0]).model
    feed = torch.tensor([40, 41, 42])
    native.prefill(PROMPT)
    tiny_lm.prefill(PROMPT)
    assert torch.allclose(tiny_lm.extend(feed), native.extend(feed), atol=2e-2)


def test_context_size_is_enforced_with_a_clear_error(tiny_gguf):
    lm = LlamaCppLM(tiny_gguf[0], max_length=16, threads=1)
    assert lm.max_length == 16
    with pytest.raises(ContextLengthError, match="at most 15 fit"):
        lm.prefill(torch.arange(3, 19))
    lm.prefill(PROMPT)
    with pytest.raises(ContextLengthError, match="would exceed the context size of 16"):
        lm.extend(torch.arange(3, 12))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 64\)"):
        lm.extend(torch.tensor([64]))


def test_a_truncated_gguf_file_is_refused_with_llama_cpps_reason(tiny_gguf, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_gguf[0].read_bytes()[:2000])
    with pytest.raises(ValueError, match="llama.cpp cannot load this GGUF file"):
        LlamaCppLM(broken, threads=1)
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        LlamaCppLM(tmp_path / "absent.gguf")
    with pytest.raises(ValueError, match="threads must be an integer >= 1"):
        LlamaCppLM(tiny_gguf[0], threads=0)


def test_a_missing_binding_names_the_install_command(monkeypatch):
    monkeypatch.setattr(binding, "llamacpp_available", lambda: False)
    binding.llama_cpp.cache_clear()
    try:
        with pytest.raises(ImportError, match="make setup"):
            binding.llama_cpp()
    finally:
        binding.llama_cpp.cache_clear()
    assert "install_llama_cpp.sh" in INSTALL_COMMAND


def test_the_llamacpp_backend_takes_gguf_files_only(tmp_path):
    with pytest.raises(ValueError, match="runs GGUF files"):
        backends.load(str(tmp_path), "llamacpp")
    with pytest.raises(ValueError, match="packing='dual' is the native engine's"):
        backends.load("smollm2-135m-instruct", "llamacpp", packing="dual")


def test_auto_times_both_engines_once_and_caches_the_choice(tiny_gguf, monkeypatch):
    path = str(tiny_gguf[0])
    calls = []
    monkeypatch.setattr(backends, "_time_single_tokens", lambda model: calls.append(type(model).__name__) or
                        (0.001 if isinstance(model, LlamaCppLM) else 0.002))
    assert backends.fastest_gguf_engine(path, threads=1) == "llamacpp"
    assert sorted(calls) == ["LlamaCppLM", "NativeLM"]
    monkeypatch.setattr(backends, "_time_single_tokens", lambda model: pytest.fail("timed again"))
    assert backends.fastest_gguf_engine(path, threads=1) == "llamacpp"  # from the cache
    assert isinstance(backends.load(path, "auto", threads=1).model, LlamaCppLM)


def test_auto_takes_llamacpp_for_a_large_file_the_native_engine_has_not_converted(tiny_gguf, tmp_path, monkeypatch):
    """Timing the native engine would convert the file first (minutes for a 1.5B model): not for a guess."""
    import shutil

    path = str(shutil.copy(tiny_gguf[0], tmp_path / "large.gguf"))  # no conversion of it is cached
    monkeypatch.setattr(backends, "_CONVERT_TO_TIME_UP_TO", 0)
    monkeypatch.setattr(backends, "_time_single_tokens", lambda model: pytest.fail("timed"))
    assert backends.fastest_gguf_engine(path, threads=1) == "llamacpp"
    backends.load(path, "native")  # converted now: 'auto' times both
    monkeypatch.setattr(backends, "_time_single_tokens", lambda model: 0.001 if isinstance(model, NativeLM) else 0.002)
    assert backends.fastest_gguf_engine(path, threads=1) == "native"


def test_auto_runs_gguf_on_native_without_the_binding(tiny_gguf, monkeypatch):
    monkeypatch.setattr(backends, "llamacpp_available", lambda: False)
    assert backends.fastest_gguf_engine(str(tiny_gguf[0])) == "native"


@pytest.mark.slow
@pytest.mark.real_model
def test_greedy_prompt_lookup_on_the_default_gguf_is_token_identical():
    """The real SmolLM2-135M Q4_1 file on llama.cpp: prompt lookup (gamma 4, every call) against the target alone."""
    loaded = load_llamacpp()
    eos = loaded.model.eos_token_ids()
    prompts = ["Write a short story that repeats the line: the quick brown fox jumps over the lazy dog.",
               "List the days of the week, then list them again in reverse order."]
    drafted = 0
    for text in prompts:
        ids = torch.tensor(loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                                add_generation_prompt=True, return_dict=True)["input_ids"])
        options = dict(max_new_tokens=96, sampling=SamplingParams(0.0), eos_token_ids=eos)
        plain = generate(loaded.model, ids, **options)
        speculative = generate(loaded.model, ids, drafter=PromptLookupDrafter(), gamma=4, **options)
        assert speculative.token_ids == plain.token_ids, text
        drafted += speculative.stats.accepted_tokens
    assert drafted > 10  # the drafts were accepted, not only proposed


def test_cost_profile_is_timed_once_and_cached(tiny_lm, monkeypatch):
    from specdecode import cost_profile

    profile = cost_profile.measure_cost_profile(tiny_lm, 4, reps=2)
    assert sorted(profile.target_seconds) == [1, 2, 3, 4] and profile.switch_seconds >= 0
    monkeypatch.setattr(cost_profile, "_time_pattern", lambda *a: pytest.fail("timed again"))
    assert cost_profile.measure_cost_profile(tiny_lm, 4) == profile
    files = list(cost_profile.timing_file("costs", {}).parent.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"]["engine"] == "LlamaCppLM"


def test_a_gguf_draft_model_on_llama_cpp_keeps_greedy_output_identical(tiny_gguf, tiny_lm, tmp_path):
    from specdecode.drafters import ModelDrafter

    draft_path = write_tiny_gguf(tmp_path / "draft.gguf", tiny_llama_variant(seed=2, num_hidden_layers=1),
                                 vocabulary=SPECIALS + WORDS)  # a smaller random model on the same vocabulary
    drafter = ModelDrafter(LlamaCppLM(draft_path, max_length=128, threads=1))
    options = dict(max_new_tokens=40, sampling=SamplingParams(0.0))
    plain = generate(tiny_lm, PROMPT, **options)
    speculative = generate(tiny_lm, PROMPT, drafter=drafter, gamma=3, **options)
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.draft_tokens > 0


def test_an_eagle_draft_reads_llama_cpps_features(tiny_gguf):
    """keep_features: llama.cpp's final-norm outputs, as the native engine's; an EAGLE draft on them keeps greedy
    output identical to the target alone."""
    import dataclasses

    from specdecode.drafters.eagle import EagleDrafter
    from specdecode.native.eagle import EagleNetwork

    lm = LlamaCppLM(tiny_gguf[0], max_length=128, threads=1)
    native = load_native(tiny_gguf[0]).model
    for model in (lm, native):
        model.keep_features()
        model.prefill(PROMPT)
        model.extend(torch.tensor([11, 12]))
    assert torch.allclose(lm.features(0, 10), native.features(0, 10), atol=2e-2)
    assert torch.equal(lm.embed_tokens(torch.tensor([5, 6])), native.embed_tokens(torch.tensor([5, 6])))
    torch.manual_seed(0)
    network = EagleNetwork(dataclasses.replace(native.config, num_layers=1), 64)
    drafter = EagleDrafter(network, torch.arange(64), lm)
    options = dict(max_new_tokens=30, sampling=SamplingParams(0.0))
    plain = generate(lm, PROMPT, **options)
    speculative = generate(lm, PROMPT, drafter=drafter, gamma=3, **options)
    assert speculative.token_ids == plain.token_ids and speculative.stats.draft_tokens > 0
    with pytest.raises(ValueError, match="features of positions"):
        lm.features(0, 200)
