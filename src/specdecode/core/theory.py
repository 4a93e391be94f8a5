"""Closed-form analysis of speculative decoding (Leviathan et al., 2023, section 3).

Formulas from Leviathan, Kalman & Matias, "Fast Inference from Transformers via
Speculative Decoding" (ICML 2023):

* ``alpha``: acceptance rate, the expected probability that a draft token is
  accepted (Definition 3.1); ``alpha = sum_x min(p(x), q(x))`` (Corollary 3.6).
* ``gamma``: number of draft tokens proposed per target call.
* ``c``: cost coefficient, the ratio between the walltime of one draft-model
  run and one target-model run.
* ``c_hat``: the same ratio for arithmetic operations per token.

All functions except :func:`acceptance_rate` are pure Python (no torch); the
latter imports torch lazily. Invalid arguments raise :class:`ValueError`
naming the offending parameter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "PAPER_TABLE1_C",
    "PAPER_TABLE1_C_HAT",
    "PAPER_TABLE1_SETTINGS",
    "SpeedupRow",
    "acceptance_rate",
    "arithmetic_operations_factor",
    "expected_speedup_table",
    "expected_tokens_per_call",
    "optimal_gamma",
    "paper_table1",
    "walltime_improvement",
]


# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return value


def _check_alpha(alpha: object) -> float:
    a = _check_real("alpha", alpha)
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return a


def _check_gamma(gamma: object, name: str = "gamma") -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, int):
        raise ValueError(f"{name} must be an integer >= 1, got {gamma!r}")
    if gamma < 1:
        raise ValueError(f"{name} must be >= 1, got {gamma!r}")
    return gamma


def _check_cost(c: object, name: str) -> float:
    v = _check_real(name, c)
    if not v >= 0.0 or math.isinf(v):
        raise ValueError(f"{name} must be >= 0 and finite, got {c!r}")
    return v


def _geometric(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha), with the alpha -> 1 limit gamma + 1."""
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


# --------------------------------------------------------------------------- #
# Section 3 formulas
# --------------------------------------------------------------------------- #


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """Expected tokens generated per target call, Eq. (1).

    ``E[#tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)``; for ``alpha == 1``
    the limit ``gamma + 1`` is returned. ``alpha`` must be in [0, 1].
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    return _geometric(a, g)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement factor, Theorem 3.8.

    ``(1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + 1))``, assuming enough
    compute for the gamma + 1 target runs to be parallel (alpha == 1 uses the
    limit ``(gamma + 1) / (gamma c + 1)``).
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    cc = _check_cost(c, "c")
    return _geometric(a, g) / (g * cc + 1.0)


def arithmetic_operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Expected factor of increase in arithmetic operations, Theorem 3.11.

    ``(1 - alpha) (gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))``
    (alpha == 1 uses the limit ``(gamma c_hat + gamma + 1) / (gamma + 1)``).
    """
    a = _check_alpha(alpha)
    g = _check_gamma(gamma)
    ch = _check_cost(c_hat, "c_hat")
    return (g * ch + g + 1.0) / _geometric(a, g)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """Integer ``gamma`` in [1, max_gamma] maximising :func:`walltime_improvement`; ties go to the smaller.

    With a free draft (c == 0) and alpha > 0 every extra draft token helps, however
    little, so the answer is max_gamma (float rounding would hide gains below 1e-16).
    """
    a = _check_alpha(alpha)
    cc = _check_cost(c, "c")
    mg = _check_gamma(max_gamma, "max_gamma")
    if cc == 0.0:
        return mg if a > 0.0 else 1
    return max(range(1, mg + 1), key=lambda g: (walltime_improvement(a, g, cc), -g))


def acceptance_rate(p: torch.Tensor | Sequence[float], q: torch.Tensor | Sequence[float]) -> torch.Tensor | float:
    """Acceptance rate ``alpha = sum_x min(p(x), q(x))`` (Definition 3.1, Corollary 3.6).

    ``p`` is the target distribution and ``q`` the draft distribution over the
    last dimension (the vocabulary). Torch tensors of (broadcastable) shapes
    ``[..., V]`` give a tensor of shape ``[...]``; plain sequences of floats
    give a Python float. Inputs are assumed to be probability distributions.
    """
    import torch

    is_tensor = isinstance(p, torch.Tensor) or isinstance(q, torch.Tensor)
    pt = torch.as_tensor(p)
    qt = torch.as_tensor(q)
    if not pt.is_floating_point():
        pt = pt.to(torch.get_default_dtype())
    if not qt.is_floating_point():
        qt = qt.to(torch.get_default_dtype())
    if pt.dim() == 0:
        raise ValueError("p must have at least one dimension (the vocabulary)")
    if qt.dim() == 0:
        raise ValueError("q must have at least one dimension (the vocabulary)")
    if pt.shape[-1] != qt.shape[-1]:
        raise ValueError(f"p and q must share the vocabulary size (last dim), got {pt.shape[-1]} and {qt.shape[-1]}")
    try:
        torch.broadcast_shapes(pt.shape, qt.shape)
    except RuntimeError as exc:
        raise ValueError(f"p and q shapes are not broadcastable: {tuple(pt.shape)} vs {tuple(qt.shape)}") from exc
    alpha = torch.minimum(pt, qt).sum(dim=-1)
    if is_tensor:
        return alpha
    return float(alpha)


# --------------------------------------------------------------------------- #
# Table helper
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class SpeedupRow:
    """One row of an expected-speedup table.

    speed: expected walltime improvement (Theorem 3.8).
    ops: expected factor of increase in arithmetic operations (Theorem 3.11).
    """

    alpha: float
    gamma: int
    c: float
    c_hat: float
    speed: float
    ops: float


# Inputs of the (alpha, gamma) table in Leviathan et al. (2023), section 3:
# expected walltime improvement and arithmetic-operations increase for a few
# (alpha, gamma) settings, with the draft cost neglected (c = c_hat = 0).
# Only the inputs live here; the outputs are computed from the formulas.
PAPER_TABLE1_SETTINGS: tuple[tuple[float, int], ...] = (
    (0.6, 2),
    (0.7, 3),
    (0.8, 2),
    (0.8, 5),
    (0.9, 2),
    (0.9, 10),
)
PAPER_TABLE1_C: float = 0.0
PAPER_TABLE1_C_HAT: float = 0.0


def expected_speedup_table(
    settings: Iterable[tuple[float, int]],
    c: float = 0.0,
    c_hat: float | None = None,
) -> list[SpeedupRow]:
    """Rows of expected speed / arithmetic-ops factors for ``(alpha, gamma)`` pairs.

    ``c_hat`` defaults to ``c``.
    """
    cc = _check_cost(c, "c")
    ch = cc if c_hat is None else _check_cost(c_hat, "c_hat")
    rows = []
    for alpha, gamma in settings:
        rows.append(
            SpeedupRow(
                alpha=float(alpha),
                gamma=gamma,
                c=cc,
                c_hat=ch,
                speed=walltime_improvement(alpha, gamma, cc),
                ops=arithmetic_operations_factor(alpha, gamma, ch),
            )
        )
    return rows


def paper_table1() -> list[SpeedupRow]:
    """The paper's (alpha, gamma) table (c = c_hat = 0), computed from the formulas."""
    return expected_speedup_table(PAPER_TABLE1_SETTINGS, c=PAPER_TABLE1_C, c_hat=PAPER_TABLE1_C_HAT)
