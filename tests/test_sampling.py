"""Sampling transforms: temperature, top-k, top-p; greedy one-hot; validation."""

import math

import pytest
import torch
from scipy.stats import chisquare

from specdecode.core.sampling import SamplingParams, invert_cdf, probabilities, sample

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def test_temperature_one_is_softmax():
    assert torch.allclose(probabilities(LOGITS, SamplingParams(1.0)), torch.softmax(LOGITS, -1))


def test_temperature_scales_logits():
    assert torch.allclose(probabilities(LOGITS, SamplingParams(0.5)), torch.softmax(LOGITS / 0.5, -1))


@pytest.mark.parametrize("temperature", [1e-40, 1e-30])
def test_a_tiny_temperature_gives_the_argmax_not_nan(temperature):
    """logits / 1e-40 overflow to inf (softmax: NaN) unless the logits are shifted by their maximum first."""
    logits = torch.tensor([[31.0, 30.5, -2.0, float("-inf")], [-5.0, -4.0, -4.5, -6.0]])
    probs = probabilities(logits, SamplingParams(temperature))
    assert torch.equal(probs, torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]))


def test_greedy_is_one_hot_at_argmax():
    p = probabilities(torch.stack([LOGITS, -LOGITS]), SamplingParams(0.0))
    assert p.tolist() == [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


def test_top_k_keeps_k_most_likely():
    p = probabilities(LOGITS, SamplingParams(1.0, top_k=2))
    expected = torch.softmax(LOGITS[:2], -1)
    assert torch.allclose(p[:2], expected) and p[2:].sum() == 0


def test_top_p_keeps_smallest_nucleus():
    full = torch.softmax(LOGITS, -1)  # 0.48, 0.18, 0.11, 0.07, 0.02 roughly
    top_p = float(full[0] + full[1]) - 1e-3  # first two tokens reach it, the first alone does not
    p = probabilities(LOGITS, SamplingParams(1.0, top_p=top_p))
    assert torch.allclose(p[:2], full[:2] / full[:2].sum()) and p[2:].sum() == 0


def test_top_p_always_keeps_the_most_likely_token():
    p = probabilities(LOGITS, SamplingParams(1.0, top_p=1e-6))
    assert p.tolist() == [1, 0, 0, 0, 0]


def test_transforms_compose_in_order_temperature_topk_topp():
    params = SamplingParams(0.7, top_k=3, top_p=0.9)
    scaled = torch.softmax(LOGITS[:3] / 0.7, -1)
    keep = 2 if float(scaled[0] + scaled[1]) >= 0.9 else 3
    p = probabilities(LOGITS, params)
    assert torch.allclose(p[:keep], scaled[:keep] / scaled[:keep].sum())
    assert p[keep:].sum() == 0


def test_batch_shapes_and_float32():
    logits = torch.randn(3, 4, 7, dtype=torch.float64)
    p = probabilities(logits, SamplingParams(0.8, top_k=4, top_p=0.95))
    assert p.shape == (3, 4, 7) and p.dtype == torch.float32
    assert torch.allclose(p.sum(-1), torch.ones(3, 4))


def test_minus_inf_logits_get_zero_probability():
    p = probabilities(torch.tensor([0.0, float("-inf"), 1.0]), SamplingParams(1.3))
    assert p[1] == 0 and not torch.isnan(p).any()


def test_sample_draws_the_given_distribution_and_never_a_zero_probability_token():
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.5, 0.0])  # unnormalised, zeros inside and at both ends
    draws = sample(weights.expand(200_000, -1), torch.Generator().manual_seed(0))  # [200000]
    counts = torch.bincount(draws, minlength=len(weights))
    assert counts[weights == 0].sum() == 0
    keep = weights > 0
    expected = weights[keep].double() / weights.sum().double() * len(draws)
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3


def test_inverting_the_cdf_at_its_total_gives_the_last_token_of_positive_probability():
    cdf = torch.tensor([[0.0, 0.25, 0.25, 1.0, 1.0, 1.0]], dtype=torch.float64)  # tokens 1 and 3 only
    assert invert_cdf(cdf, torch.tensor([[1.0]], dtype=torch.float64)).tolist() == [3]
    assert invert_cdf(cdf, torch.tensor([[0.0]], dtype=torch.float64)).tolist() == [1]
    assert invert_cdf(cdf, torch.tensor([[0.25]], dtype=torch.float64)).tolist() == [3]


@pytest.mark.parametrize("row", [[0.0, 0.0, 0.0], [0.5, float("nan"), 0.5]])
def test_sample_refuses_a_row_without_positive_mass(row):
    with pytest.raises(ValueError, match="sample: every row of probs"):
        sample(torch.tensor([[0.2, 0.3, 0.5], row]), None)


def test_sample_is_reproducible_with_a_generator():
    probs = torch.softmax(torch.randn(10, 50), -1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert a.shape == (10,) and torch.equal(a, b)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.2), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
    ],
)
def test_bad_parameters_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)
