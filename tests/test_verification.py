"""Algorithm 1 in isolation: one verification step, its distribution and its numerical traps."""

import pytest
import torch
from scipy.stats import chisquare

from specdecode.core.sampling import SamplingParams, probabilities, sample
from specdecode.core.verification import verify, verify_greedy

SAMPLES = 20000


def _first_token_histogram(p, q, gamma, seed=0, one_hot=False):
    """Histogram of the first emitted token of many verification steps (accepted x_1 or the resample)."""
    g = torch.Generator().manual_seed(seed)
    vocab = p.shape[-1]
    counts = torch.zeros(vocab)
    for _ in range(SAMPLES):
        if one_hot:
            tokens = torch.full((gamma,), 2)
            outcome = verify(tokens, None, p, g)
        else:
            tokens = sample(q, g)
            outcome = verify(tokens, q, p, g)
        first = int(tokens[0]) if outcome.num_accepted > 0 else outcome.next_token
        counts[first] += 1
    return counts


def _assert_distributed_as(counts, probs):
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token with target probability 0 was emitted"
    result = chisquare(counts[keep].numpy(), (probs[keep] * counts.sum()).numpy())
    assert result.pvalue > 1e-3, f"first token not distributed as p (p-value {result.pvalue:.2e})"


@pytest.mark.parametrize("gamma", [1, 4])
def test_first_token_is_distributed_as_target(gamma):
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(gamma + 1, 10) * 2, -1)
    q = torch.softmax(torch.randn(gamma, 10) * 2, -1)
    _assert_distributed_as(_first_token_histogram(p, q, gamma), p[0])


def test_one_hot_draft_is_exact():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(3, 6), -1)
    _assert_distributed_as(_first_token_histogram(p, None, 2, one_hot=True), p[0])


def test_broken_residual_is_caught(monkeypatch):
    """The statistical check above fails when the rejection resamples from p instead of the residual."""
    import specdecode.core.verification as verification

    monkeypatch.setattr(verification, "_residual", lambda p, token, q: p)
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(2, 10) * 2, -1)
    q = torch.softmax(torch.randn(1, 10) * 2, -1)
    with pytest.raises(AssertionError, match="not distributed as p"):
        _assert_distributed_as(_first_token_histogram(p, q, 1), p[0])


def test_equal_distributions_accept_everything_and_never_nan():
    p = torch.softmax(torch.randn(4, 8), -1)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens = sample(p[:3], g)
        outcome = verify(tokens, p[:3].clone(), p, g)
        assert outcome.num_accepted == 3 and 0 <= outcome.next_token < 8


def test_all_zero_residual_falls_back_without_nan():
    import specdecode.core.verification as verification

    p = torch.tensor([0.25, 0.25, 0.5])
    residual = verification._residual(p, torch.tensor(0), p.clone())
    assert torch.equal(residual, p)


def test_zero_probability_token_is_never_accepted():
    """Strict r * q < p: a draft token the target gives probability 0 is rejected even when r = 0."""

    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        outcome = verify(torch.tensor([0]), q, p, g)
        assert outcome.num_accepted == 0 and outcome.next_token == 1


def test_disjoint_support_always_resamples_from_target():
    p = torch.tensor([[0.0, 0.0, 0.3, 0.7]] * 3)
    q = torch.tensor([[0.6, 0.4, 0.0, 0.0]] * 2)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        outcome = verify(sample(q, g), q, p, g)
        assert outcome.num_accepted == 0 and outcome.next_token in (2, 3)


def test_all_accepted_draws_bonus_from_last_position():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    outcome = verify(torch.tensor([1, 1]), None, p, torch.Generator().manual_seed(0))
    assert (outcome.num_accepted, outcome.next_token) == (2, 2)


def test_narrower_or_wider_draft_vocabulary():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    g = torch.Generator().manual_seed(0)
    wide_q = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # proposes id 3, outside the target's vocabulary
    outcome = verify(torch.tensor([3]), wide_q, p, g)
    assert outcome.num_accepted == 0 and outcome.next_token in (0, 1)
    narrow_q = torch.tensor([[1.0, 0.0]])
    outcome = verify(torch.tensor([0]), narrow_q, p, g)
    assert outcome.next_token in (0, 1)


def test_greedy_verification_is_the_temperature_zero_case():
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(0)
    greedy = SamplingParams(0.0)
    for _ in range(50):
        target_logits = torch.randn(5, 6)
        draft_tokens = torch.randint(0, 6, (4,))
        draft_tokens[:2] = target_logits[:2].argmax(-1)  # often accept a prefix
        expected = verify_greedy(draft_tokens, target_logits.argmax(-1))
        q = torch.nn.functional.one_hot(draft_tokens, 6).float()
        assert verify(draft_tokens, q, probabilities(target_logits, greedy), g) == expected
        assert verify(draft_tokens, None, probabilities(target_logits, greedy), g) == expected


def test_shape_errors_name_the_tensor():
    with pytest.raises(ValueError, match="target_probs"):
        verify(torch.tensor([1, 2]), None, torch.ones(2, 4) / 4, None)
    with pytest.raises(ValueError, match="draft_probs"):
        verify(torch.tensor([1, 2]), torch.ones(1, 4) / 4, torch.ones(3, 4) / 4, None)
    with pytest.raises(ValueError, match="target_tokens"):
        verify_greedy(torch.tensor([1, 2]), torch.tensor([1, 2]))
