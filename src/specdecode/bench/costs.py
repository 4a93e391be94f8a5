"""Model costs for the Thm 3.8 prediction, timed directly on the models' `extend` calls.

T(k): one `extend` of k tokens after a context, rolled back each time. The target is timed for
k = 1 .. max gamma + 1, each draft model for k = 1; all interleaved (the order rotates every
repetition) and reduced to medians. c = T_draft(1) / T_target(1); the verification cost of a
gamma-token draft is T_target(gamma + 1) / T_target(1).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from specdecode.cost_profile import time_extend

__all__ = ["time_extend", "summarize_costs"]


def summarize_costs(times: Mapping[str, Mapping[int, Sequence[float]]], target: str = "target") -> dict:
    """Medians, T(k)/T(1) of the target and c of every other model, from time_extend's result."""
    medians = {name: {int(k): statistics.median(v) for k, v in per_k.items() if v} for name, per_k in times.items()}
    t1 = medians[target][1]
    return {  # k as strings, as they read back from JSON
        "median_seconds": {name: {str(k): t for k, t in per_k.items()} for name, per_k in medians.items()},
        "verify_ratio": {str(k): t / t1 for k, t in medians[target].items()},
        "c": {name: per_k[1] / t1 for name, per_k in medians.items() if name != target and 1 in per_k},
        "target_t1": t1,
    }
