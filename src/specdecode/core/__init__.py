"""Pure tensor code: sampling transforms, verification (Algorithm 1), theory and cost-aware draft lengths. No model code."""

from specdecode.core.draft_length import AdaptiveDraftLength, CostProfile, best_draft_length
from specdecode.core.sampling import SamplingParams, probabilities, sample
from specdecode.core.theory import (
    acceptance_rate,
    arithmetic_operations_factor,
    expected_tokens_per_call,
    optimal_gamma,
    walltime_improvement,
)
from specdecode.core.verification import Verification, verify, verify_greedy

__all__ = [
    "AdaptiveDraftLength",
    "CostProfile",
    "best_draft_length",
    "SamplingParams",
    "probabilities",
    "sample",
    "acceptance_rate",
    "arithmetic_operations_factor",
    "expected_tokens_per_call",
    "optimal_gamma",
    "walltime_improvement",
    "Verification",
    "verify",
    "verify_greedy",
]
