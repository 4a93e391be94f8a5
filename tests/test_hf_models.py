"""The Hugging Face adapters on tiny random models: KV rollback, greedy identity, vocabularies, loading.

Every model is built from a config with random weights under a fixed seed (see
`tiny_hf`), so nothing is downloaded and each test takes well under a second.
"""

from __future__ import annotations

import pytest
import torch
from tiny_hf import (
    EOS_ID,
    VOCAB_SIZE,
    WORDS,
    perturbed_copy,
    save_tiny_checkpoint,
    tiny_llama,
    tiny_qwen2,
    tiny_t5,
    tiny_tokenizer,
)
from transformers import LlamaForCausalLM, T5ForConditionalGeneration

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters import ModelDrafter, PromptLookupDrafter
from specdecode.models import (
    ContextLengthError,
    HFCausalLM,
    HFSeq2SeqLM,
    IncompatibleVocabularyError,
    LanguageModel,
    check_vocabularies,
    wrap_hf_model,
)
from specdecode.models.loading import LoadedModel, load_model
from specdecode.pipeline import make_drafter

GREEDY = SamplingParams(0.0)
ATOL = 1e-5

# Built once per session: construction is the slow part, and the models are never modified.
MODELS = {
    "llama": tiny_llama(seed=0),
    "llama_draft": tiny_llama(seed=1, layers=1),
    "qwen2": tiny_qwen2(seed=2),
    "t5": tiny_t5(seed=3),
    "t5_draft": tiny_t5(seed=4),
}
# Drafts close to their target: most draft tokens are accepted, some rejected part-way.
MODELS["llama_near"] = perturbed_copy(MODELS["llama"], seed=10, scale=0.05)
MODELS["qwen2_near"] = perturbed_copy(MODELS["qwen2"], seed=11, scale=0.05)
MODELS["t5_near"] = perturbed_copy(MODELS["t5"], seed=12, scale=0.05)

PROMPTS = [
    [5, 9, 12, 20, 7],
    [40, 41, 42, 43, 40, 41, 42, 43, 40, 41],  # repetitive: prompt lookup finds matches
    [30],  # a single token
]


def _cat(*parts) -> torch.Tensor:
    return torch.tensor([t for part in parts for t in part], dtype=torch.long)


def _full_forward(hf_model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Logits [len(generated) + 1, V] of one cache-free forward: row i predicts the token after generated[:i]."""
    with torch.no_grad():
        if hf_model.config.is_encoder_decoder:
            start = hf_model.config.decoder_start_token_id
            out = hf_model(input_ids=_cat(prompt)[None], decoder_input_ids=_cat([start], generated)[None], use_cache=False)
            return out.logits[0].float()
        out = hf_model(input_ids=_cat(prompt, generated)[None], use_cache=False)
        return out.logits[0, len(prompt) - 1 :].float()


# --------------------------------------------------------------------------- KV rollback


@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_wrap_picks_adapter(kind):
    model = wrap_hf_model(MODELS[kind], name="tiny")
    assert isinstance(model, HFSeq2SeqLM if kind == "t5" else HFCausalLM)
    assert isinstance(model, LanguageModel)
    assert model.name == "tiny"
    assert model.vocab_size == VOCAB_SIZE


@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_rollback_matches_fresh_prefill_and_full_forward(kind):
    hf = MODELS[kind]
    prompt, first, second, j = [5, 9, 12, 20, 7, 33], [10, 11, 12, 13, 14], [50, 51, 52, 53], 2

    model = wrap_hf_model(hf)
    prefill_logits = model.prefill(_cat(prompt))
    assert prefill_logits.shape == (VOCAB_SIZE,)
    assert model.num_generated == 0
    first_logits = model.extend(_cat(first))
    assert first_logits.shape == (len(first), VOCAB_SIZE)
    assert model.num_generated == len(first)
    model.rollback(j)
    assert model.num_generated == j
    after = model.extend(_cat(second))
    assert model.num_generated == j + len(second)

    # A fresh prefill + extend of the same sequence.
    fresh = wrap_hf_model(hf)
    fresh_prefill = fresh.prefill(_cat(prompt))
    fresh_logits = fresh.extend(_cat(first[:j], second))
    torch.testing.assert_close(prefill_logits, fresh_prefill, atol=ATOL, rtol=0)
    torch.testing.assert_close(after, fresh_logits[j:], atol=ATOL, rtol=0)
    torch.testing.assert_close(first_logits[:j], fresh_logits[:j], atol=ATOL, rtol=0)

    # One forward of the whole sequence without any cache.
    full = _full_forward(hf, prompt, first[:j] + second)
    torch.testing.assert_close(prefill_logits, full[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(after, full[1 + j :], atol=ATOL, rtol=0)

    # The check can fail: without the rollback the rejected tokens would still be attended to.
    stale = wrap_hf_model(hf)
    stale.prefill(_cat(prompt))
    stale.extend(_cat(first))
    assert (stale.extend(_cat(second)) - after).abs().max() > 1e-2


def test_rollback_past_a_sliding_window():
    """A Mistral with a 16-token window, 30 tokens in: rolling back keeps the logits of one cache-free forward."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, sliding_window=16,
                           initializer_range=0.3)
    torch.manual_seed(0)
    hf = MistralForCausalLM(config).eval()
    ids = [(7 * i) % VOCAB_SIZE for i in range(40)]
    model = wrap_hf_model(hf)
    model.prefill(_cat(ids[:25]))
    model.extend(_cat(ids[25:30], [1, 2, 3]))
    model.rollback(5)
    after = model.extend(_cat(ids[30:40]))
    torch.testing.assert_close(after, _full_forward(hf, ids[:25], ids[25:40])[6:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_repeated_rollbacks_and_rollback_to_zero(kind):
    hf = MODELS[kind]
    prompt = [7, 8, 9]
    model = wrap_hf_model(hf)
    model.prefill(_cat(prompt))
    model.extend(_cat([20, 21, 22]))
    model.rollback(3)  # a no-op
    assert model.num_generated == 3
    model.extend(_cat([23]))
    model.rollback(1)
    model.extend(_cat([30, 31]))
    model.rollback(0)
    assert model.num_generated == 0
    logits = model.extend(_cat([40, 41, 42]))
    torch.testing.assert_close(logits, _full_forward(hf, prompt, [40, 41, 42])[1:], atol=ATOL, rtol=0)
    model.rollback(2)
    logits = model.extend(_cat([43]))
    torch.testing.assert_close(logits, _full_forward(hf, prompt, [40, 41, 43])[3:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_prefill_resets_the_cache(kind):
    hf = MODELS[kind]
    model = wrap_hf_model(hf)
    model.prefill(_cat([5, 6, 7, 8]))
    model.extend(_cat([9, 10, 11]))
    prompt = [12, 13]
    logits = model.prefill(_cat(prompt))
    assert model.num_generated == 0
    torch.testing.assert_close(logits, _full_forward(hf, prompt, [])[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(model.extend(_cat([14, 15])), _full_forward(hf, prompt, [14, 15])[1:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_rollback_out_of_range_raises(kind):
    model = wrap_hf_model(MODELS[kind])
    model.prefill(_cat([5, 6, 7]))
    model.extend(_cat([8, 9]))
    for bad in (3, -1, 100):
        with pytest.raises(ValueError, match="num_generated"):
            model.rollback(bad)
    assert model.num_generated == 2  # unchanged by the failed calls
    logits = model.extend(_cat([10]))
    torch.testing.assert_close(logits, _full_forward(MODELS[kind], [5, 6, 7], [8, 9, 10])[3:], atol=ATOL, rtol=0)


def test_extend_before_prefill_raises():
    with pytest.raises(RuntimeError, match="prefill"):
        wrap_hf_model(MODELS["llama"]).extend(_cat([1]))


@pytest.mark.parametrize("builder", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def test_causal_room_and_context_limit(builder):
    model = wrap_hf_model(builder(seed=5, max_positions=16))
    assert model.max_length == 16
    model.prefill(_cat(range(3, 13)))  # 10 prompt tokens
    assert model.room() == 6
    model.extend(_cat([20, 21]))
    assert model.room() == 4
    with pytest.raises(ContextLengthError, match="context window"):
        model.extend(_cat([22, 23, 24, 25, 26]))
    assert model.num_generated == 2 and model.room() == 4  # the failed call changed nothing
    model.rollback(1)
    assert model.room() == 5
    model.extend(_cat([22, 23, 24, 25, 26]))
    assert model.room() == 0
    with pytest.raises(ContextLengthError):
        model.extend(_cat([27]))
    # A prompt as long as the context leaves no room: refused up front.
    with pytest.raises(ContextLengthError, match="prompt"):
        model.prefill(_cat(range(3, 19)))
    assert model.prefill(_cat(range(3, 18))).shape == (VOCAB_SIZE,)  # 15 of 16 fits
    assert model.room() == 1


def test_seq2seq_room_and_context_limit():
    # T5 has relative positions, so no hard limit unless the config names one.
    assert wrap_hf_model(MODELS["t5"]).max_length == 1 << 20
    model = wrap_hf_model(tiny_t5(seed=5, n_positions=8))
    assert model.max_length == 8
    model.prefill(_cat(range(3, 11)))  # the encoder takes all 8
    assert model.room() == 7  # the decoder holds the start token too
    model.extend(_cat([20, 21, 22]))
    assert model.room() == 4
    with pytest.raises(ContextLengthError):
        model.extend(_cat([23, 24, 25, 26, 27]))
    assert model.num_generated == 3
    model.extend(_cat([23, 24, 25, 26]))
    assert model.room() == 0
    with pytest.raises(ContextLengthError):
        model.extend(_cat([27]))
    with pytest.raises(ContextLengthError, match="prompt"):
        model.prefill(_cat(range(3, 12)))  # 9 > 8


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_bad_prompts_raise(kind):
    model = wrap_hf_model(MODELS[kind])
    with pytest.raises(ValueError):
        model.prefill(torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D"):
        model.prefill(torch.tensor([[5, 6]]))
    for bad in ([3, VOCAB_SIZE], [-1, 4]):  # ids outside the embedding table: a clear error, as the native engine's
        with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {VOCAB_SIZE}\)"):
            model.prefill(torch.tensor(bad))
    model.prefill(_cat([5, 6]))
    with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {VOCAB_SIZE}\)"):
        model.extend(torch.tensor([VOCAB_SIZE]))
    with pytest.raises(ValueError, match="at least one token"):
        model.extend(torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("gamma", [1, 3])
def test_generation_stops_at_a_full_context(gamma):
    hf = tiny_llama(seed=6, max_positions=16)
    prompt = list(range(3, 13))
    plain = generate(wrap_hf_model(hf), prompt, max_new_tokens=50, sampling=GREEDY)
    # 6 free positions: 6 tokens are fed back, and the 7th is predicted from the last position.
    assert plain.finish_reason == "context"
    assert len(plain.token_ids) == 7
    assert plain.token_ids == _hf_greedy(hf, prompt, 7)
    for drafter in (ModelDrafter(wrap_hf_model(hf)), ModelDrafter(wrap_hf_model(tiny_llama(seed=7, max_positions=16)))):
        spec = generate(wrap_hf_model(hf), prompt, drafter=drafter, gamma=gamma, max_new_tokens=50, sampling=GREEDY)
        assert spec.token_ids == plain.token_ids
        assert spec.finish_reason == "context"


def test_draft_with_a_shorter_context_than_the_target():
    """When the sequence outgrows the draft's window, the target goes on alone: same output, no error."""
    target = tiny_llama(seed=6, max_positions=64)
    prompt = list(range(3, 13))
    plain = generate(wrap_hf_model(target), prompt, max_new_tokens=20, sampling=GREEDY)
    assert plain.finish_reason == "length"
    short_draft = ModelDrafter(wrap_hf_model(tiny_llama(seed=6, max_positions=16)))  # same weights, 16 positions
    spec = generate(wrap_hf_model(target), prompt, drafter=short_draft, gamma=3, max_new_tokens=20, sampling=GREEDY)
    assert spec.token_ids == plain.token_ids
    assert 0 < spec.stats.accepted_tokens == spec.stats.draft_tokens <= 6  # it drafted while it had room
    assert spec.stats.target_calls > 20 - 6  # and the target made the rest one by one


def test_prompt_longer_than_the_draft_context():
    target = tiny_llama(seed=6, max_positions=64)
    prompt = list(range(3, 23))  # 20 tokens: fits the target, not the 16-position draft
    plain = generate(wrap_hf_model(target), prompt, max_new_tokens=8, sampling=GREEDY)
    short_draft = ModelDrafter(wrap_hf_model(tiny_llama(seed=6, max_positions=16)))
    spec = generate(wrap_hf_model(target), prompt, drafter=short_draft, gamma=3, max_new_tokens=8, sampling=GREEDY)
    assert spec.token_ids == plain.token_ids


# --------------------------------------------------------------------------- greedy identity


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = _cat(prompt)[None]
    with torch.no_grad():
        out = hf.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n
        )[0].tolist()
    return out[1:] if hf.config.is_encoder_decoder else out[len(prompt) :]


N_NEW = 24
_REFERENCE: dict[tuple[str, int], tuple[list[int], list[int]]] = {}


def _reference(kind: str, p: int) -> tuple[list[int], list[int]]:
    """(plain loop, HF generate) greedy continuations of PROMPTS[p] by MODELS[kind]; computed once."""
    if (kind, p) not in _REFERENCE:
        hf = MODELS[kind]
        plain = generate(wrap_hf_model(hf), PROMPTS[p], max_new_tokens=N_NEW, sampling=GREEDY)
        assert plain.finish_reason == "length"
        assert plain.stats.target_calls == N_NEW and plain.stats.draft_calls == 0
        _REFERENCE[kind, p] = (plain.token_ids, _hf_greedy(hf, PROMPTS[p], N_NEW))
    return _REFERENCE[kind, p]


@pytest.mark.parametrize("kind", list(MODELS))
def test_plain_loop_equals_hf_generate(kind):
    for p in range(len(PROMPTS)):
        plain, hf = _reference(kind, p)
        assert len(plain) == N_NEW
        assert plain == hf, f"prompt {p}"
        assert EOS_ID not in plain
        assert len(set(plain)) >= 3  # a real continuation, not one token repeated


def test_models_disagree():
    """The pairs below are meaningful only if target and draft continue differently."""
    for target, draft in PAIRS.values():
        assert any(_reference(target, p)[0] != _reference(draft, p)[0] for p in range(len(PROMPTS)))


PAIRS = {  # name: (target, draft)
    "llama+llama": ("llama", "llama_draft"),
    "llama+llama_near": ("llama", "llama_near"),
    "qwen2+llama": ("qwen2", "llama_draft"),
    "qwen2+qwen2_near": ("qwen2", "qwen2_near"),
    "t5+t5": ("t5", "t5_draft"),
    "t5+t5_near": ("t5", "t5_near"),
    "llama+t5": ("llama", "t5_draft"),  # mixed: either kind can be target or draft
    "t5+llama": ("t5", "llama_draft"),
}


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_greedy_identity_with_draft_model(pair, gamma):
    target_kind, draft_kind = PAIRS[pair]
    target = wrap_hf_model(MODELS[target_kind])
    drafter = ModelDrafter(wrap_hf_model(MODELS[draft_kind]))  # one drafter across prompts: start() must reset it
    accepted = rejections = proposed = 0
    for p, prompt in enumerate(PROMPTS):
        plain, hf = _reference(target_kind, p)
        result = generate(target, prompt, drafter=drafter, gamma=gamma, max_new_tokens=N_NEW, sampling=GREEDY)
        assert result.token_ids == plain == hf, f"prompt {p}"
        assert result.finish_reason == "length"
        s = result.stats
        assert s.gamma == gamma and s.new_tokens == N_NEW
        # every verification but the last (with one token left to make) follows one proposal
        assert s.target_calls - 2 <= s.draft_calls <= s.target_calls - 1
        assert s.accepted_tokens + s.rejections <= s.draft_tokens <= gamma * s.draft_calls
        # each target call yields the accepted draft plus one token of its own
        assert s.new_tokens == s.target_calls + s.accepted_tokens
        assert sum(s.accepted_per_position) == s.accepted_tokens
        accepted += s.accepted_tokens
        rejections += s.rejections
        proposed += s.draft_tokens
    assert rejections > 0  # the draft disagrees, so the rollback path ran
    if draft_kind.endswith("_near"):
        assert accepted > proposed // 5  # ... and agrees often, so partial acceptance happened too


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_greedy_identity_target_as_its_own_draft(kind, gamma):
    target = wrap_hf_model(MODELS[kind])
    drafter = ModelDrafter(wrap_hf_model(MODELS[kind]))  # same weights, its own cache
    for p, prompt in enumerate(PROMPTS):
        plain, hf = _reference(kind, p)
        result = generate(target, prompt, drafter=drafter, gamma=gamma, max_new_tokens=N_NEW, sampling=GREEDY)
        assert result.token_ids == plain == hf
        s = result.stats
        assert s.rejections == 0 and s.alpha == 1.0
        assert s.accepted_tokens == s.draft_tokens
        # the first token comes from the prefill, then gamma + 1 tokens per call (fewer at the end)
        assert s.target_calls == 1 + -(-(N_NEW - 1) // (gamma + 1))
        assert s.accepted_per_position == s.proposed_per_position


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "t5"])
def test_greedy_identity_with_prompt_lookup(kind, gamma):
    target = wrap_hf_model(MODELS[kind])
    for p, prompt in enumerate(PROMPTS):
        plain, hf = _reference(kind, p)
        result = generate(
            target, prompt, drafter=PromptLookupDrafter(), gamma=gamma, max_new_tokens=N_NEW, sampling=GREEDY
        )
        assert result.token_ids == plain == hf
        assert result.stats.new_tokens == N_NEW
        assert result.stats.draft_tokens > 0  # the repetitive prompt and the continuation give matches


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_eos_ends_generation(kind):
    hf = MODELS[kind]
    plain, _ = _reference(kind, 0)
    eos = plain[5]
    cut = plain.index(eos)
    for drafter in (None, ModelDrafter(wrap_hf_model(hf)), PromptLookupDrafter()):
        result = generate(
            wrap_hf_model(hf), PROMPTS[0], drafter=drafter, gamma=3, max_new_tokens=N_NEW, sampling=GREEDY,
            eos_token_ids={eos},
        )
        assert result.token_ids == plain[: cut + 1]
        assert result.finish_reason == "eos"


# --------------------------------------------------------------------------- vocabularies


def test_identical_tokenizers_pass():
    check_vocabularies(tiny_tokenizer(), tiny_tokenizer(), VOCAB_SIZE, VOCAB_SIZE)


def test_draft_with_extra_tokens_passes():
    check_vocabularies(tiny_tokenizer(), tiny_tokenizer(WORDS + ["extra", "words"]), VOCAB_SIZE, VOCAB_SIZE + 2)


def test_permuted_ids_raise():
    with pytest.raises(IncompatibleVocabularyError, match="draft") as info:
        check_vocabularies(tiny_tokenizer(), tiny_tokenizer(list(reversed(WORDS))), VOCAB_SIZE, VOCAB_SIZE)
    assert "different ids" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_swapping_two_tokens_raises():
    words = list(WORDS)
    words[0], words[1] = words[1], words[0]
    with pytest.raises(IncompatibleVocabularyError, match="2 tokens have different ids"):
        check_vocabularies(tiny_tokenizer(), tiny_tokenizer(words), VOCAB_SIZE, VOCAB_SIZE)


def test_disjoint_vocabulary_raises():
    other = [f"w{i}" for i in range(len(WORDS))]
    with pytest.raises(IncompatibleVocabularyError, match=r"draft: it knows only 3 of the target's 64 tokens"):
        check_vocabularies(tiny_tokenizer(), tiny_tokenizer(other), VOCAB_SIZE, VOCAB_SIZE)


def test_small_overlap_raises():
    half = WORDS[:30]  # same ids for the shared half
    with pytest.raises(IncompatibleVocabularyError, match="knows only 33 of"):
        check_vocabularies(tiny_tokenizer(), tiny_tokenizer(half), VOCAB_SIZE, len(half) + 3)


def test_without_tokenizers_sizes_must_match():
    check_vocabularies(None, None, VOCAB_SIZE, VOCAB_SIZE)
    check_vocabularies(tiny_tokenizer(), None, VOCAB_SIZE, VOCAB_SIZE)
    for target_tok, draft_tok in ((None, None), (tiny_tokenizer(), None), (None, tiny_tokenizer())):
        with pytest.raises(IncompatibleVocabularyError, match="draft"):
            check_vocabularies(target_tok, draft_tok, VOCAB_SIZE, VOCAB_SIZE + 1)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("llama"), MODELS["llama"], tiny_tokenizer())


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("t5"), MODELS["t5"], tiny_tokenizer())


def test_make_drafter_refuses_incompatible_checkpoint(llama_dir, tmp_path):
    target = load_model(llama_dir)
    bad = save_tiny_checkpoint(tmp_path / "permuted", MODELS["llama_draft"], tiny_tokenizer(list(reversed(WORDS))))
    with pytest.raises(IncompatibleVocabularyError, match="draft"):
        make_drafter(str(bad), target)
    disjoint = save_tiny_checkpoint(
        tmp_path / "disjoint", MODELS["llama_draft"], tiny_tokenizer([f"w{i}" for i in range(len(WORDS))])
    )
    with pytest.raises(IncompatibleVocabularyError, match="knows only"):
        make_drafter(str(disjoint), target)
    # No tokenizer on the draft side, and a different width of logits.
    wide = save_tiny_checkpoint(tmp_path / "wide", tiny_llama(seed=8, vocab=VOCAB_SIZE + 8))
    with pytest.raises(IncompatibleVocabularyError, match="72 entries"):
        make_drafter(str(wide), target)


def test_make_drafter_accepts_compatible_checkpoint(llama_dir, t5_dir):
    target = load_model(llama_dir)
    for path in (llama_dir, t5_dir):
        drafter = make_drafter(str(path), target)
        assert isinstance(drafter, ModelDrafter)
        assert drafter.name == f"model:{path}"
    assert make_drafter("none", target) is None
    assert make_drafter(None, target) is None
    assert isinstance(make_drafter("ngram", target), PromptLookupDrafter)


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize(
    "kind,adapter,hf_class", [("llama", HFCausalLM, LlamaForCausalLM), ("t5", HFSeq2SeqLM, T5ForConditionalGeneration)]
)
def test_load_model_from_directory(kind, adapter, hf_class, llama_dir, t5_dir):
    path = llama_dir if kind == "llama" else t5_dir
    loaded = load_model(path)
    assert isinstance(loaded, LoadedModel)
    assert isinstance(loaded.model, adapter)
    assert isinstance(loaded.hf_model, hf_class)
    assert loaded.source == str(path)
    assert loaded.model.name == str(path)
    assert loaded.model.vocab_size == VOCAB_SIZE
    assert loaded.tokenizer is not None
    assert loaded.tokenizer.get_vocab() == tiny_tokenizer().get_vocab()
    assert loaded.tokenizer.eos_token_id == EOS_ID
    assert loaded.tokenizer.chat_template
    assert loaded.tokenizer("the cat")["input_ids"] == [3 + WORDS.index("the"), 3 + WORDS.index("cat")]
    # The weights survived the round trip.
    plain, _ = _reference(kind, 0)
    assert generate(loaded.model, PROMPTS[0], max_new_tokens=N_NEW, sampling=GREEDY).token_ids == plain


def test_load_model_without_tokenizer(tmp_path):
    path = save_tiny_checkpoint(tmp_path / "bare", MODELS["llama"])
    loaded = load_model(path)
    assert loaded.tokenizer is None
    assert isinstance(loaded.model, HFCausalLM)


def test_load_missing_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(str(tmp_path / "missing"))


def test_load_missing_relative_path_never_touches_the_network(tmp_path, monkeypatch):
    import huggingface_hub.file_download as file_download

    real = file_download._get_metadata_or_catch_error
    network: list[str] = []

    def guarded(**kwargs):  # every Hub file lookup passes here; force it local and remember the attempt
        if not kwargs["local_files_only"]:
            network.append(kwargs["repo_id"])
            kwargs["local_files_only"] = True
        return real(**kwargs)

    monkeypatch.setattr(file_download, "_get_metadata_or_catch_error", guarded)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError):  # FileNotFoundError is an OSError
        load_model("models/missing-model")
    assert network == []


def test_load_missing_gguf_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF"):
        load_model(tmp_path / "model.gguf")
    with pytest.raises(FileNotFoundError, match="GGUF"):
        load_model("relative/missing.gguf")
