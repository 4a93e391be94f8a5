"""Tests for specdecode.core.theory (Leviathan et al. 2023, section 3)."""

from __future__ import annotations

import math

import pytest
import torch

from specdecode.core.theory import (
    PAPER_TABLE1_SETTINGS,
    SpeedupRow,
    acceptance_rate,
    arithmetic_operations_factor,
    expected_speedup_table,
    expected_tokens_per_call,
    optimal_gamma,
    paper_table1,
    walltime_improvement,
)

# Issue tracker: "A test reproduces the paper's Table 1 (alpha/gamma -> 1.96x,
# 2.53x, 2.44x, 3.69x, 2.71x, 6.86x speed; 1.53x, 1.58x, 1.23x, 1.63x, 1.11x,
# 1.60x ops)". (alpha, gamma, speed, ops), with c = c_hat = 0.
PAPER_TABLE1 = [
    (0.6, 2, 1.96, 1.53),
    (0.7, 3, 2.53, 1.58),
    (0.8, 2, 2.44, 1.23),
    (0.8, 5, 3.69, 1.63),
    (0.9, 2, 2.71, 1.11),
    (0.9, 10, 6.86, 1.60),
]


# --------------------------------------------------------------------------- #
# Table 1
# --------------------------------------------------------------------------- #


def test_paper_table1_reproduced_to_two_decimals():
    rows = paper_table1()
    assert len(rows) == len(PAPER_TABLE1)
    for row, (alpha, gamma, speed, ops) in zip(rows, PAPER_TABLE1, strict=True):
        assert isinstance(row, SpeedupRow)
        assert (row.alpha, row.gamma, row.c, row.c_hat) == (alpha, gamma, 0.0, 0.0)
        assert round(row.speed, 2) == speed, (alpha, gamma, row.speed)
        assert round(row.ops, 2) == ops, (alpha, gamma, row.ops)


@pytest.mark.parametrize(("alpha", "gamma", "speed", "ops"), PAPER_TABLE1)
def test_paper_table1_rows_via_formulas(alpha, gamma, speed, ops):
    assert walltime_improvement(alpha, gamma, 0.0) == pytest.approx(speed, abs=0.005)
    assert arithmetic_operations_factor(alpha, gamma, 0.0) == pytest.approx(ops, abs=0.005)
    # With c = 0 the walltime improvement is exactly the expected tokens per call.
    assert walltime_improvement(alpha, gamma, 0.0) == pytest.approx(expected_tokens_per_call(alpha, gamma))


def test_paper_table1_settings_constant():
    assert [(a, g) for a, g, _, _ in PAPER_TABLE1] == list(PAPER_TABLE1_SETTINGS)


def test_expected_speedup_table_with_costs():
    rows = expected_speedup_table([(0.8, 4)], c=0.05, c_hat=0.1)
    (row,) = rows
    assert (row.c, row.c_hat) == (0.05, 0.1)
    # (1 - 0.8^5) / (0.2 * 1.2) = 0.67232 / 0.24
    assert row.speed == pytest.approx(0.67232 / 0.24)
    # 0.2 * (0.4 + 4 + 1) / 0.67232
    assert row.ops == pytest.approx(0.2 * 5.4 / 0.67232)
    # c_hat defaults to c
    (row2,) = expected_speedup_table([(0.8, 4)], c=0.05)
    assert row2.c_hat == 0.05


# --------------------------------------------------------------------------- #
# Closed forms
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("gamma", [1, 2, 5, 17])
def test_alpha_zero_gives_one_token_per_call(gamma):
    assert expected_tokens_per_call(0.0, gamma) == 1.0
    assert walltime_improvement(0.0, gamma, 0.0) == 1.0
    assert walltime_improvement(0.0, gamma, 0.5) == pytest.approx(1.0 / (gamma * 0.5 + 1.0))
    assert arithmetic_operations_factor(0.0, gamma, 0.0) == gamma + 1


@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_alpha_one_limit(gamma):
    assert expected_tokens_per_call(1.0, gamma) == gamma + 1
    near = expected_tokens_per_call(1.0 - 1e-9, gamma)
    assert near == pytest.approx(gamma + 1, rel=1e-6)
    assert walltime_improvement(1.0, gamma, 0.1) == pytest.approx((gamma + 1) / (gamma * 0.1 + 1))
    assert arithmetic_operations_factor(1.0, gamma, 0.0) == pytest.approx(1.0)


def test_specific_values():
    # Eq. (1): 1 + 0.5 + 0.25 + 0.125
    assert expected_tokens_per_call(0.5, 3) == pytest.approx(1.875)
    assert walltime_improvement(0.5, 3, 0.1) == pytest.approx(1.875 / 1.3)
    assert arithmetic_operations_factor(0.5, 3, 0.1) == pytest.approx(4.3 / 1.875)
    assert expected_tokens_per_call(0.9, 1) == pytest.approx(1.9)


def test_speed_times_ops_identity():
    # speed * ops = (gamma c_hat + gamma + 1) / (gamma c + 1)
    for alpha in (0.1, 0.55, 0.95):
        for gamma in (1, 4, 9):
            s = walltime_improvement(alpha, gamma, 0.02)
            o = arithmetic_operations_factor(alpha, gamma, 0.03)
            assert s * o == pytest.approx((gamma * 0.03 + gamma + 1) / (gamma * 0.02 + 1))


# --------------------------------------------------------------------------- #
# optimal_gamma
# --------------------------------------------------------------------------- #


def _brute_force_gamma(alpha, c, max_gamma):
    vals = [walltime_improvement(alpha, g, c) for g in range(1, max_gamma + 1)]
    return 1 + max(range(len(vals)), key=lambda i: (vals[i], -i))


@pytest.mark.parametrize("c", [0.01, 0.05, 0.1, 0.3])
def test_optimal_gamma_non_decreasing_in_alpha(c):
    alphas = [i / 20 for i in range(1, 20)]
    gammas = [optimal_gamma(a, c) for a in alphas]
    assert gammas == sorted(gammas), gammas
    for a, g in zip(alphas, gammas, strict=True):
        assert g == _brute_force_gamma(a, c, 64)


def test_optimal_gamma_specific_values():
    # alpha=0.8, c=0.05: gamma 7/8/9 -> 3.082 / 3.092 / 3.078
    assert optimal_gamma(0.8, 0.05) == 8
    # alpha=0.9, c=0.05: gamma 12/13/14 -> 4.661 / 4.674 / 4.671
    assert optimal_gamma(0.9, 0.05) == 13
    assert optimal_gamma(0.5, 0.05) == 3
    assert optimal_gamma(0.3, 0.5) == 1
    # non-decreasing as c shrinks
    assert optimal_gamma(0.8, 0.01) >= optimal_gamma(0.8, 0.05) >= optimal_gamma(0.8, 0.2)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8, 0.99, 1.0])
def test_optimal_gamma_free_draft_is_max_gamma(alpha):
    # c = 0: improvement strictly increases with gamma (even below float resolution).
    assert optimal_gamma(alpha, 0.0) == 64
    assert optimal_gamma(alpha, 0.0, max_gamma=7) == 7


def test_optimal_gamma_ties_go_to_smaller():
    # alpha = 0, c = 0: improvement is 1 for every gamma.
    assert optimal_gamma(0.0, 0.0) == 1
    assert optimal_gamma(0.0, 0.1) == 1
    assert optimal_gamma(0.9, 0.05, max_gamma=1) == 1


# --------------------------------------------------------------------------- #
# acceptance_rate
# --------------------------------------------------------------------------- #


def test_acceptance_rate_identical_is_one():
    p = torch.softmax(torch.randn(5, 11, generator=torch.Generator().manual_seed(0)), dim=-1)
    alpha = acceptance_rate(p, p.clone())
    assert isinstance(alpha, torch.Tensor)
    assert alpha.shape == (5,)
    torch.testing.assert_close(alpha, torch.ones(5))


def test_acceptance_rate_disjoint_is_zero():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.3, 0.7])
    alpha = acceptance_rate(p, q)
    assert alpha.shape == ()
    assert float(alpha) == 0.0


def test_acceptance_rate_specific_value_and_symmetry():
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    # min: 0.4 + 0.2 + 0.1 = 0.7 = 1 - TV(p, q)
    assert float(acceptance_rate(p, q)) == pytest.approx(0.7)
    assert float(acceptance_rate(q, p)) == pytest.approx(0.7)
    tv = 0.5 * (p - q).abs().sum()
    assert float(acceptance_rate(p, q)) == pytest.approx(1 - float(tv))


def test_acceptance_rate_batch_shapes_and_broadcast():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(2, 3, 7, generator=g), dim=-1)
    q = torch.softmax(torch.randn(2, 3, 7, generator=g), dim=-1)
    alpha = acceptance_rate(p, q)
    assert alpha.shape == (2, 3)
    assert torch.all((alpha >= 0) & (alpha <= 1 + 1e-6))
    torch.testing.assert_close(alpha[1, 2], acceptance_rate(p[1, 2], q[1, 2]))
    # q shared across the batch
    alpha_b = acceptance_rate(p, q[0, 0])
    assert alpha_b.shape == (2, 3)
    torch.testing.assert_close(alpha_b[1, 1], acceptance_rate(p[1, 1], q[0, 0]))


def test_acceptance_rate_plain_sequences_give_float():
    alpha = acceptance_rate([0.25, 0.75], [0.5, 0.5])
    assert isinstance(alpha, float)
    assert alpha == pytest.approx(0.75)


def test_acceptance_rate_bad_shapes():
    with pytest.raises(ValueError, match="last dim"):
        acceptance_rate(torch.ones(3) / 3, torch.ones(4) / 4)
    with pytest.raises(ValueError, match="broadcastable"):
        acceptance_rate(torch.ones(2, 3) / 3, torch.ones(4, 3) / 3)
    with pytest.raises(ValueError, match="p must have at least one dimension"):
        acceptance_rate(torch.tensor(1.0), torch.ones(1))


# --------------------------------------------------------------------------- #
# Validation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("alpha", [-0.1, 1.2, math.nan, "0.5", None, True])
def test_bad_alpha(alpha):
    for fn in (
        lambda: expected_tokens_per_call(alpha, 2),
        lambda: walltime_improvement(alpha, 2, 0.0),
        lambda: arithmetic_operations_factor(alpha, 2, 0.0),
        lambda: optimal_gamma(alpha, 0.1),
    ):
        with pytest.raises(ValueError, match="alpha"):
            fn()


def test_bad_alpha_message():
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.2"):
        expected_tokens_per_call(1.2, 2)


@pytest.mark.parametrize("gamma", [0, -3, 2.0, 1.5, True, None])
def test_bad_gamma(gamma):
    for fn in (
        lambda: expected_tokens_per_call(0.5, gamma),
        lambda: walltime_improvement(0.5, gamma, 0.0),
        lambda: arithmetic_operations_factor(0.5, gamma, 0.0),
    ):
        with pytest.raises(ValueError, match="gamma"):
            fn()
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        expected_tokens_per_call(0.5, 0)


@pytest.mark.parametrize("c", [-0.01, math.inf, math.nan, "0"])
def test_bad_c(c):
    with pytest.raises(ValueError, match="c must"):
        walltime_improvement(0.5, 2, c)
    with pytest.raises(ValueError, match="c must"):
        optimal_gamma(0.5, c)
    with pytest.raises(ValueError, match="c must"):
        expected_speedup_table([(0.5, 2)], c=c)
    with pytest.raises(ValueError, match="c_hat must"):
        arithmetic_operations_factor(0.5, 2, c)
    with pytest.raises(ValueError, match="c_hat must"):
        expected_speedup_table([(0.5, 2)], c=0.0, c_hat=c)


def test_bad_c_message():
    with pytest.raises(ValueError, match="c must be >= 0"):
        walltime_improvement(0.5, 2, -1.0)


@pytest.mark.parametrize("max_gamma", [0, -1, 3.0])
def test_bad_max_gamma(max_gamma):
    with pytest.raises(ValueError, match="max_gamma"):
        optimal_gamma(0.5, 0.1, max_gamma=max_gamma)
