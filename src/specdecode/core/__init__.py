"""Pure tensor code: sampling transforms, verification (Algorithm 1) and theory. No model code."""

from specdecode.core.sampling import SamplingParams, greedy_tokens, probabilities, sample
from specdecode.core.verification import Verification, verify, verify_greedy

__all__ = ["SamplingParams", "Verification", "greedy_tokens", "probabilities", "sample", "verify", "verify_greedy"]
