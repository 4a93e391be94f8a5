"""Drafters on their own: what they propose and the q they report."""

import pytest
import torch
from mock_models import TableModel

from specdecode.core.sampling import SamplingParams
from specdecode.drafters import BigramDrafter, ModelDrafter, PromptLookupDrafter, UnigramDrafter
from specdecode.drafters.prompt_lookup import find_continuation

GREEDY = SamplingParams(0.0)


def ids(*values):
    return torch.tensor(values, dtype=torch.long)


def test_prompt_lookup_prefers_the_longest_suffix_match():
    #             0  1  2  3  4  5  6  7  8  9
    context = ids(5, 6, 7, 1, 6, 7, 2, 9, 5, 6, 7)
    # suffix (5, 6, 7) occurs at 0 -> continues with 1, 6, 7; the 2-gram (6, 7) would match later at 4 -> 2
    assert find_continuation(context, 3, max_ngram=3).tolist() == [1, 6, 7]
    assert find_continuation(context, 3, max_ngram=2).tolist() == [2, 9, 5]  # most recent (6, 7) match


def test_prompt_lookup_without_a_match_proposes_nothing():
    assert find_continuation(ids(1, 2, 3, 4), 5, max_ngram=3).tolist() == []


def test_prompt_lookup_is_clipped_by_the_context_end_and_gamma():
    assert find_continuation(ids(3, 4, 3), 5, max_ngram=2).tolist() == [4, 3]
    assert find_continuation(ids(1, 2, 3, 4, 5, 1), 2, max_ngram=2).tolist() == [2, 3]


def test_prompt_lookup_drafter_uses_prompt_and_generated():
    drafter = PromptLookupDrafter(max_ngram=2)
    drafter.start(ids(10, 11, 12, 13))
    draft = drafter.propose(ids(10, 11), 3, GREEDY, None)
    assert draft.tokens.tolist() == [12, 13, 10] and draft.probs is None


@pytest.mark.parametrize("kwargs", [dict(min_ngram=0), dict(max_ngram=1, min_ngram=2)])
def test_prompt_lookup_rejects_bad_ngram_sizes(kwargs):
    with pytest.raises(ValueError, match="ngram"):
        PromptLookupDrafter(**kwargs)


def test_unigram_fits_frequencies():
    drafter = UnigramDrafter.fit([[0, 1, 1], [1, 2]], vocab_size=4, smoothing=0.0)
    assert torch.allclose(drafter.log_probs.exp(), torch.tensor([0.2, 0.6, 0.2, 0.0]))
    assert drafter.propose(ids(0), 3, GREEDY, None).tokens.tolist() == [1, 1, 1]
    draft = drafter.propose(ids(0), 3, SamplingParams(1.0), torch.Generator().manual_seed(0))
    assert draft.probs.shape == (3, 4) and torch.allclose(draft.probs.sum(-1), torch.ones(3))
    assert all(t != 3 for t in draft.tokens.tolist())


def test_unigram_refuses_out_of_range_tokens():
    with pytest.raises(ValueError, match="outside"):
        UnigramDrafter.fit([[0, 7]], vocab_size=4)


def test_bigram_interpolates_with_unigram():
    drafter = BigramDrafter.fit([[0, 1, 0, 2]], vocab_size=3, smoothing=0.0, lam=0.5)
    unigram = torch.tensor([0.5, 0.25, 0.25])
    assert torch.allclose(drafter.conditional(0), 0.5 * unigram + 0.5 * torch.tensor([0.0, 0.5, 0.5]))
    assert torch.allclose(drafter.conditional(2), unigram)  # never seen as a predecessor
    drafter.start(ids(2, 0))
    draft = drafter.propose(ids(), 2, SamplingParams(1.0), torch.Generator().manual_seed(0))
    assert draft.probs.shape == (2, 3) and torch.allclose(draft.probs[0], drafter.conditional(0))


def test_model_drafter_reports_the_distribution_it_sampled_from():
    model = TableModel(6, 3)
    drafter = ModelDrafter(model)
    drafter.start(ids(0, 1))
    sampling = SamplingParams(0.8, top_k=4)
    draft = drafter.propose(ids(2), 3, sampling, torch.Generator().manual_seed(0))
    context = [0, 1, 2]
    from specdecode.core.sampling import probabilities

    for i in range(3):
        assert torch.allclose(draft.probs[i], probabilities(model.logits_after(context), sampling))
        context.append(int(draft.tokens[i]))


def test_model_drafter_resyncs_after_a_rejection():
    """After the target rejects part of a draft, the drafter's cache follows the real sequence."""
    fresh = ModelDrafter(TableModel(16, 3))
    reused = ModelDrafter(TableModel(16, 3))
    reused.start(ids(0, 1))
    first = reused.propose(ids(4), 5, GREEDY, None).tokens.tolist()
    generated = ids(4, first[0], first[1], (first[2] + 1) % 16)  # two accepted, then a different token
    fresh.start(ids(0, 1))
    assert reused.propose(generated, 4, GREEDY, None).tokens.tolist() == fresh.propose(generated, 4, GREEDY, None).tokens.tolist()
    assert reused.model.num_generated == len(generated) + 3  # fed all but the last draft token


def test_model_drafter_needs_start():
    with pytest.raises(RuntimeError, match="start"):
        ModelDrafter(TableModel(4, 0)).propose(ids(1), 2, GREEDY, None)


def test_model_drafter_with_a_short_context_stops_drafting_instead_of_failing():
    from specdecode.decoding import generate

    target = TableModel(16, 0)
    drafter = ModelDrafter(TableModel(16, 0, max_length=8))  # prompt 2 + 6 tokens
    result = generate(target, [0, 1], drafter=drafter, gamma=3, max_new_tokens=20, sampling=GREEDY)
    expected = generate(TableModel(16, 0), [0, 1], max_new_tokens=20, sampling=GREEDY)
    assert result.token_ids == expected.token_ids
    assert result.stats.draft_tokens <= 8


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_model_drafter_ends_its_draft_after_the_first_token_its_q_gave_less_than_min_confidence(temperature):
    """The draft is the full draft's prefix up to and including the first token whose q (at T=0 the softmax of
    the logits) is below min_confidence; the q it reports for the tokens it keeps are unchanged, and it feeds
    its model none of the tokens after that one."""
    sampling = SamplingParams(temperature)

    def proposal(min_confidence: float) -> tuple[ModelDrafter, object]:
        drafter = ModelDrafter(TableModel(8, 5), min_confidence=min_confidence)
        drafter.start(ids(0, 1))
        return drafter, drafter.propose(ids(2), 6, sampling, torch.Generator().manual_seed(0))

    _, full = proposal(0.0)
    context = [0, 1, 2] + full.tokens.tolist()
    confidences = [float(torch.softmax(TableModel(8, 5).logits_after(context[: 3 + i]), dim=-1)[token])
                   for i, token in enumerate(full.tokens.tolist())]  # q at T=1 and at T=0
    assert len(full) == 6
    for threshold in sorted(confidences)[:4]:
        ends = next((i + 1 for i, c in enumerate(confidences) if c < threshold), 6)
        drafter, draft = proposal(threshold)
        assert draft.tokens.tolist() == full.tokens[:ends].tolist(), f"threshold {threshold}"
        assert drafter.model.num_generated == 1 + ends - 1  # the generated token and all draft tokens but the last
        if not sampling.greedy:
            torch.testing.assert_close(draft.probs, full.probs[:ends])
    assert len(proposal(1.0)[1]) == 1  # no q of a random table reaches 1


@pytest.mark.parametrize("value", [-0.1, 1.5, True, "0.5"])
def test_model_drafter_min_confidence_must_be_a_probability(value):
    with pytest.raises(ValueError, match="min_confidence"):
        ModelDrafter(TableModel(4, 0), min_confidence=value)


def test_the_ngram_index_drafts_what_find_match_does_as_the_context_grows():
    """PromptLookupDrafter's incremental index against the reference search, on random small-vocabulary contexts
    (many repeats), token by token, and after a context that is not an extension of the last one."""
    from specdecode.drafters.prompt_lookup import NgramIndex, find_match

    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        context = torch.randint(0, 4 + trial % 5, (60,), generator=g).tolist()
        index = NgramIndex(3, 1 + trial % 2)
        for length in list(range(1, 61)) + [30, 45]:  # then shorter: a fresh index
            expected_tokens, expected_n = find_match(torch.tensor(context[:length]), 4, 3, 1 + trial % 2)
            assert index.match(context[:length], 4) == (expected_tokens.tolist(), expected_n), (trial, length)
