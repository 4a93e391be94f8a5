"""End-to-end exactness: speculative samples are distributed exactly as the target's own samples.

A weightless table model with a small vocabulary stands in for the target, so the
exact distribution over every continuation can be enumerated and compared with
the empirical distribution of tens of thousands of speculative samples (chi-square,
fixed seeds). The first token of each continuation is fixed by a peaked table row
only where noted; otherwise all tokens count.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from mock_models import SuccessorDrafter, TableModel
from scipy.stats import chisquare

from specdecode.core.draft_length import AdaptiveDraftLength, CostProfile
from specdecode.core.sampling import SamplingParams, probabilities
from specdecode.decoding import generate
from specdecode.drafters import BigramDrafter, LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter, UnigramDrafter
from specdecode.drafters.distilled import ReducedVocabLM, build_draft_transformer
from specdecode.drafters.eagle import EagleDrafter
from specdecode.native.quant import Int8Embedding, quantize_per_channel
from specdecode.native.config import NativeConfig
from specdecode.native.eagle import EagleNetwork
from specdecode.native.engine import NativeLM
from specdecode.native.model import NativeTransformer

PROMPT = [0, 1]
P_VALUE_FLOOR = 1e-3


def chi_square_pvalue(target, drafter, sampling, length, gamma, samples, seed=0, draft_length=None) -> tuple[float, float]:
    """(p-value, total variation) of speculative samples against the exact distribution.

    target: a TableModel, or a NativeLM (its distribution enumerated with its own forward passes).
    draft_length: a factory of a fresh cost-aware draft length for each sample (None: gamma every call).
    """
    if isinstance(target, NativeLM):
        exact = native_sequence_distribution(target, PROMPT, length, sampling)
    else:
        exact = target.sequence_distribution(PROMPT, length, sampling)
    g = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    for _ in range(samples):
        result = generate(
            target, PROMPT, drafter=drafter, gamma=gamma, max_new_tokens=length, sampling=sampling, generator=g,
            draft_length=None if draft_length is None else draft_length(),
        )
        counts[tuple(result.token_ids)] += 1
    impossible = [seq for seq in counts if seq not in exact]
    assert not impossible, f"sampled continuations the target gives probability 0: {impossible[:3]}"
    cells = sorted(exact, key=exact.get, reverse=True)
    observed, expected, rest_obs, rest_exp = [], [], 0, 0.0
    for seq in cells:  # cells expected fewer than 5 times are pooled into one
        if exact[seq] * samples >= 5:
            observed.append(counts[seq])
            expected.append(exact[seq] * samples)
        else:
            rest_obs += counts[seq]
            rest_exp += exact[seq] * samples
    if rest_exp > 0:
        observed.append(rest_obs)
        expected.append(rest_exp)
    scale = samples / sum(expected)  # float rounding of the enumerated probabilities
    expected = [e * scale for e in expected]
    tv = 0.5 * sum(abs(counts[s] / samples - exact[s]) for s in exact)
    return chisquare(observed, expected).pvalue, tv


def _draft(vocab, seed=1, **kwargs):
    return ModelDrafter(TableModel(vocab, seed, **kwargs))


def _wide_draft(vocab: int) -> ModelDrafter:
    """A draft model whose vocabulary has 3 tokens more than the target's, which it often proposes (p = 0 there)."""
    wide = TableModel(vocab + 3, 1)
    wide.table[..., vocab:] += 1.0
    return ModelDrafter(wide)


def _reduced_table_draft(vocab: int, head: list[int]) -> ModelDrafter:
    """A draft whose head scores only `head` (q = 0 elsewhere), as a distilled draft with a reduced vocabulary."""
    narrow = TableModel(vocab, 1)
    narrow.table = narrow.table[..., : len(head)].contiguous()  # logits [len(head)] for the ids in head
    return ModelDrafter(ReducedVocabLM(narrow, torch.tensor(head), vocab))


def _distilled_draft(vocab: int, head: list[int], int8_embedding: bool = False) -> ModelDrafter:
    """A random distilled-draft transformer on the native engine, reduced head, as `specdecode distill` builds it.

    int8_embedding: its embedding an int8 table, as a draft cut from the target (--target-layers) runs it.
    """
    config = NativeConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(3)
    model = build_draft_transformer(config, len(head))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    if int8_embedding:
        model.embed = Int8Embedding(*quantize_per_channel(model.embed.weight), torch.float32)
    return ModelDrafter(ReducedVocabLM(NativeLM(model, max_cache_len=64), torch.tensor(head), vocab))


def native_sequence_distribution(target: NativeLM, prompt: list[int], length: int, sampling) -> dict:
    """The exact probability of every continuation of `length` tokens, from the target's own forward passes."""
    out: dict[tuple[int, ...], float] = {}

    def expand(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length:
            out[prefix] = prob
            return
        p = probabilities(target.prefill(torch.tensor(prompt + list(prefix))), sampling)
        for token in p.nonzero().flatten().tolist():
            expand(prefix + (token,), prob * float(p[token]))

    expand((), 1.0)
    return out


def _random_native(config: NativeConfig, seed: int) -> NativeTransformer:
    torch.manual_seed(seed)
    model = NativeTransformer(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


TINY_NATIVE = NativeConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                           num_kv_heads=1, head_dim=8, max_position_embeddings=64)


def _eagle_case(head: list[int], min_confidence: float = 0.0) -> tuple[NativeLM, EagleDrafter]:
    """A random two-layer native target and a random EAGLE draft on its features, reduced head."""
    target = NativeLM(_random_native(TINY_NATIVE, 4), max_cache_len=64, packing="none")
    torch.manual_seed(6)
    network = EagleNetwork(dataclasses.replace(TINY_NATIVE, num_layers=1), len(head))
    with torch.no_grad():
        for p in network.parameters():
            p.normal_(0.0, 0.5)
        network.head_weight.normal_(0.0, 1.0)
    return target, EagleDrafter(network, torch.tensor(head), target, min_confidence=min_confidence)


CASES = {
    # name: (target kwargs, drafter factory, sampling, vocab, length, gamma)
    "T=1 gamma=1": (dict(), lambda v: _draft(v), SamplingParams(1.0), 8, 3, 1),
    "T=1 gamma=4": (dict(), lambda v: _draft(v), SamplingParams(1.0), 4, 6, 4),
    "T=0.7 top-k=3": (dict(), lambda v: _draft(v), SamplingParams(0.7, top_k=3), 8, 3, 2),
    "top-p=0.8": (dict(), lambda v: _draft(v), SamplingParams(1.0, top_p=0.8), 8, 3, 2),
    "draft == target": (dict(), lambda v: ModelDrafter(TableModel(v, 0)), SamplingParams(1.0), 4, 6, 4),
    "disjoint support": (
        dict(mask=torch.arange(8) < 4),
        lambda v: _draft(v, mask=torch.arange(8) >= 4),
        SamplingParams(1.0),
        8,
        3,
        2,
    ),
    "model draft ending early (min-confidence 0.4)": (
        dict(), lambda v: ModelDrafter(TableModel(v, 1), min_confidence=0.4), SamplingParams(1.0), 8, 3, 3
    ),
    "draft with tokens the target lacks": (dict(), lambda v: _wide_draft(v), SamplingParams(1.0), 8, 3, 2),
    "model draft ending early, 5 tokens (drafts of 1 to 3)": (
        dict(), lambda v: ModelDrafter(TableModel(v, 1), min_confidence=0.4), SamplingParams(1.0), 4, 5, 3
    ),
    "one-hot draft": (dict(), lambda v: SuccessorDrafter(v), SamplingParams(0.9), 8, 3, 2),
    "prompt lookup": (dict(), lambda v: PromptLookupDrafter(max_ngram=2), SamplingParams(1.0), 4, 6, 4),
    "reduced-vocabulary draft": (dict(), lambda v: _reduced_table_draft(v, [1, 3, 4, 6]), SamplingParams(1.0), 8, 3, 2),
    "distilled draft (native, reduced head)": (
        dict(), lambda v: _distilled_draft(v, [0, 2, 3, 5, 7]), SamplingParams(0.8), 8, 3, 3
    ),
    "draft cut from a target (int8 embedding)": (
        dict(), lambda v: _distilled_draft(v, [1, 2, 4, 5, 6], int8_embedding=True), SamplingParams(1.0), 8, 3, 2
    ),
    "lookup then model": (
        dict(), lambda v: LookupThenModelDrafter(_draft(v), min_match=2, max_match=3), SamplingParams(1.0), 3, 6, 3
    ),
    "unigram": (dict(), lambda v: UnigramDrafter.fit([[0, 1, 1, 2, 3, 3, 3]], v), SamplingParams(1.0), 8, 3, 2),
    "bigram": (
        dict(),
        lambda v: BigramDrafter.fit([[0, 1, 2, 3, 4, 5, 6, 7, 0, 2, 4, 6]], v, lam=0.8),
        SamplingParams(1.2, top_k=5),
        8,
        3,
        2,
    ),
}


SLOW_CASES = {"T=1 gamma=4", "draft == target", "prompt lookup", "distilled draft (native, reduced head)", "lookup then model",
              "model draft ending early, 5 tokens (drafts of 1 to 3)"}  # 1024 to 4096 cells, 20000 samples each


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n for n in CASES])
def test_speculative_samples_match_target_distribution(name):
    target_kwargs, make_drafter, sampling, vocab, length, gamma = CASES[name]
    target = TableModel(vocab, 0, **target_kwargs)
    samples = 20000 if vocab ** length > 1000 else 8000
    pvalue, tv = chi_square_pvalue(target, make_drafter(vocab), sampling, length, gamma, samples)
    assert pvalue > P_VALUE_FLOOR, f"{name}: chi-square p-value {pvalue:.2e}, total variation {tv:.3f}"


@pytest.mark.parametrize(
    "sampling, min_confidence, length",
    [(SamplingParams(0.8), 0.0, 3), (SamplingParams(0.8), 0.7, 3),
     pytest.param(SamplingParams(1.0, top_k=5), 0.0, 3, marks=pytest.mark.slow),
     pytest.param(SamplingParams(1.3, top_k=3), 0.4, 5, marks=pytest.mark.slow)],
    ids=["T=0.8", "T=0.8 min-confidence 0.7", "top-k=5", "top-k=3, 5 tokens, min-confidence 0.4"],
)
def test_eagle_samples_match_native_target_distribution(sampling, min_confidence, length):
    """The EAGLE drafter, reading a native target's features (its cache and the target's rolled back each step);
    with min_confidence its drafts end early wherever its own q is unsure. At 3 tokens every draft is one token
    long (the prefill gives the first); at 5, drafts of up to 3 tokens (1.8 on average) chain the network's own
    features, and top-k keeps the enumeration at 3^5 cells."""
    target, drafter = _eagle_case([0, 2, 3, 5, 7], min_confidence)
    if length > 3:  # the case does draft several tokens at once
        stats = generate(target, PROMPT, drafter=drafter, gamma=3, max_new_tokens=length, sampling=sampling,
                         generator=torch.Generator().manual_seed(1)).stats
        assert stats.draft_calls and stats.draft_tokens > stats.draft_calls
    pvalue, tv = chi_square_pvalue(target, drafter, sampling, length, 3, 8000 if length == 3 else 12000)
    assert pvalue > P_VALUE_FLOOR, f"EAGLE draft: chi-square p-value {pvalue:.2e}, total variation {tv:.3f}"
    if min_confidence:  # the threshold did end drafts early: fewer draft tokens per call than without it
        def tokens_per_draft(case: tuple[NativeLM, EagleDrafter]) -> float:
            stats = generate(case[0], PROMPT, drafter=case[1], gamma=3, max_new_tokens=40, sampling=sampling,
                             generator=torch.Generator().manual_seed(0)).stats
            return stats.draft_tokens / stats.draft_calls
        assert tokens_per_draft((target, drafter)) < tokens_per_draft(_eagle_case([0, 2, 3, 5, 7])) - 0.2


# Verification costs that make the cost-aware draft length switch: 3 draft tokens while the draft's estimated
# acceptance is high, none once rejections bring it down (as llama.cpp's costs here do).
SWITCHING_COSTS = CostProfile({1: 1.0, 2: 1.3, 3: 1.45, 4: 1.6, 5: 3.0})


class _CountingDraftLength(AdaptiveDraftLength):
    """Counts the unverified draft tokens it was told about (prompt lookup followed while nothing was drafted)."""

    unverified = 0

    def observe_unverified(self, source: str, position: int, accepted: bool) -> None:
        _CountingDraftLength.unverified += 1
        super().observe_unverified(source, position, accepted)


@pytest.mark.slow
@pytest.mark.parametrize("make_drafter", [lambda: _draft(4), lambda: LookupThenModelDrafter(_draft(4), 1, 2)],
                         ids=["model", "lookup-then-model"])
def test_cost_aware_draft_lengths_keep_the_target_distribution(make_drafter):
    """`--draft auto`'s draft length: chosen per call from the costs and earlier calls' acceptance, 0 included;
    with prompt lookup, also from lookups followed unverified while the target ran alone."""
    target, drafter, sampling = TableModel(4, 0), make_drafter(), SamplingParams(1.0)
    lengths: Counter = Counter()
    _CountingDraftLength.unverified = 0
    for seed in range(20):
        stats = generate(target, PROMPT, drafter=drafter, gamma=4, max_new_tokens=6, sampling=sampling,
                         generator=torch.Generator().manual_seed(seed),
                         draft_length=_CountingDraftLength(SWITCHING_COSTS, 4)).stats
        lengths.update(stats.draft_lengths)
    assert lengths[0] > 0 and sum(n for g, n in lengths.items() if g >= 2) > 0, lengths  # it does switch
    if isinstance(drafter, LookupThenModelDrafter):
        assert _CountingDraftLength.unverified > 0
    pvalue, tv = chi_square_pvalue(target, drafter, sampling, 6, 4, 20000,
                                   draft_length=lambda: AdaptiveDraftLength(SWITCHING_COSTS, 4))
    assert pvalue > P_VALUE_FLOOR, f"cost-aware draft length: chi-square p-value {pvalue:.2e}, total variation {tv:.3f}"


def test_draft_equal_to_target_accepts_everything():
    target = TableModel(4, 0)
    result = generate(target, PROMPT, drafter=ModelDrafter(TableModel(4, 0)), gamma=4, max_new_tokens=21,
                      sampling=SamplingParams(1.0), generator=torch.Generator().manual_seed(0))
    assert result.stats.alpha == 1.0
    assert result.stats.target_calls == 1 + 4  # prefill, then 4 rounds of 4 accepted + 1 bonus


def test_disjoint_support_accepts_nothing():
    target = TableModel(8, 0, mask=torch.arange(8) < 4)
    result = generate(target, PROMPT, drafter=_draft(8, mask=torch.arange(8) >= 4), gamma=3, max_new_tokens=20,
                      sampling=SamplingParams(1.0), generator=torch.Generator().manual_seed(0))
    assert result.stats.alpha == 0.0 and result.stats.target_calls == 20


def test_suite_catches_a_broken_verifier(monkeypatch):
    """Resampling from p instead of norm(max(0, p - q)) on rejection biases the output: the test must see it."""
    import specdecode.core.verification as verification

    monkeypatch.setattr(verification, "_residual", lambda p, token, q: p)
    target = TableModel(8, 0)
    pvalue, tv = chi_square_pvalue(target, _draft(8), SamplingParams(1.0), 3, 1, 8000)
    assert pvalue < 1e-6, f"a biased verifier went unnoticed (p-value {pvalue:.2e}, tv {tv:.3f})"


class MisreportingDrafter(ModelDrafter):
    """Samples from the tempered q but reports the untempered softmax: the trap of a q that is not the sampled one."""

    def propose(self, generated, gamma, sampling, generator):
        draft = super().propose(generated, gamma, sampling, generator)
        context = PROMPT + generated.tolist()
        untempered = [torch.softmax(self.model.logits_after(context + draft.tokens[:i].tolist()), -1) for i in range(len(draft))]
        return type(draft)(draft.tokens, torch.stack(untempered))


def test_suite_catches_a_misreported_draft_distribution():
    target = TableModel(8, 0)
    pvalue, tv = chi_square_pvalue(target, MisreportingDrafter(TableModel(8, 1)), SamplingParams(0.5), 3, 2, 8000)
    assert pvalue < 1e-6, f"a wrong q went unnoticed (p-value {pvalue:.2e}, tv {tv:.3f})"
