"""Model costs for the Thm 3.8 prediction, timed directly on the models' `extend` calls.

T(k): one `extend` of k tokens after a context, rolled back each time. The target is timed for
k = 1 .. max gamma + 1, each draft model for k = 1; all interleaved (the order rotates every
repetition) and reduced to medians. c = T_draft(1) / T_target(1); the verification cost of a
gamma-token draft is T_target(gamma + 1) / T_target(1).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence

import torch

from specdecode.models.base import LanguageModel

__all__ = ["time_extend", "summarize_costs"]


@torch.inference_mode()
def time_extend(
    models: Mapping[str, LanguageModel], context: torch.Tensor, ks: Mapping[str, Sequence[int]], reps: int
) -> dict[str, dict[int, list[float]]]:
    """Seconds of every extend(k tokens) after prefilling context [P]: {model: {k: [reps]}}.

    One untimed pass first (allocations, lazy initialisation); then `reps` timed passes.
    """
    for model in models.values():
        model.prefill(context)
    names = list(models)
    times: dict[str, dict[int, list[float]]] = {name: {k: [] for k in ks[name]} for name in names}
    all_ks = sorted({k for name in names for k in ks[name]})
    for rep in range(reps + 1):
        rotated = names[rep % len(names):] + names[: rep % len(names)]
        for k in all_ks:
            feed = context.repeat(-(-k // len(context)))[:k]  # [k] valid ids for every model, even past a short context
            for name in rotated:
                if k not in times[name]:
                    continue
                model = models[name]
                start = time.perf_counter()
                model.extend(feed)
                elapsed = time.perf_counter() - start
                model.rollback(0)
                if rep > 0:
                    times[name][k].append(elapsed)
    return times


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
