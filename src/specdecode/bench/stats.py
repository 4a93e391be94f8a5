"""Pure statistics of a benchmark: interleaving, acceptance counting, spreads, speedups and predictions.

Nothing here runs a model or reads a clock; every function takes plain numbers or
run records (dicts, as written to results.json) and returns plain numbers or dicts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from specdecode.core.theory import expected_tokens_per_call

__all__ = [
    "interleave",
    "run_speedup",
    "spread",
    "pool_acceptance",
    "predicted_speedup",
    "predicted_from_tokens_per_call",
    "best_key",
    "group",
    "interpolate_ratio",
]

T = TypeVar("T")


def interleave(baseline: T, methods: Sequence[T]) -> list[T]:
    """The run order A B A C A ...: the baseline before and after every method.

    len = 2 * len(methods) + 1; no methods gives no runs at all (a baseline alone measures nothing).
    """
    if not methods:
        return []
    order = [baseline]
    for method in methods:
        order += [method, baseline]
    return order


def run_speedup(tokens_per_s: float, baseline_tokens_per_s: Sequence[float]) -> float | None:
    """A method run's throughput over the mean throughput of its neighbouring baseline runs.

    Equal to the walltime ratio when both produce the same number of tokens (greedy decoding).
    None when a baseline produced nothing.
    """
    rates = [r for r in baseline_tokens_per_s if r > 0]
    if not rates or len(rates) < len(baseline_tokens_per_s) or tokens_per_s <= 0:
        return None
    return tokens_per_s / statistics.fmean(rates)


def spread(values: Iterable[float | None]) -> dict:
    """Median, quartiles (inclusive method), min, max and count of the values that are not None."""
    xs = sorted(float(v) for v in values if v is not None and not math.isnan(v))
    if not xs:
        return {"n": 0, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    if len(xs) == 1:
        q1 = q3 = xs[0]
    else:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return {"n": len(xs), "median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1]}


def pool_acceptance(stats: Iterable[Mapping]) -> dict:
    """Acceptance pooled over runs (GenerationStats.to_dict() records).

    alpha = accepted / (accepted + rejections): draft tokens after a rejection are never evaluated;
    tokens_per_call = new tokens / target calls (prefill included, as GenerationStats.mean_accepted);
    per_position[i] = accepted at draft position i / draft tokens that reached position i.
    """
    new_tokens = target_calls = accepted = rejections = draft_calls = draft_tokens = 0
    proposed_at: list[int] = []
    accepted_at: list[int] = []
    draft_seconds = 0.0
    for s in stats:
        new_tokens += s["new_tokens"]
        target_calls += s["target_calls"]
        accepted += s["accepted_tokens"]
        rejections += s["rejections"]
        draft_calls += s.get("draft_calls", 0)
        draft_tokens += s.get("draft_tokens", 0)
        draft_seconds += s.get("draft_seconds", 0.0)
        for totals, counts in ((proposed_at, s["proposed_per_position"]), (accepted_at, s["accepted_per_position"])):
            totals.extend([0] * (len(counts) - len(totals)))
            for i, count in enumerate(counts):
                totals[i] += count
    evaluated = accepted + rejections
    return {
        "new_tokens": new_tokens,
        "target_calls": target_calls,
        "accepted_tokens": accepted,
        "rejections": rejections,
        "draft_calls": draft_calls,
        "draft_tokens": draft_tokens,
        "draft_seconds": draft_seconds,
        "alpha": accepted / evaluated if evaluated else None,
        "tokens_per_call": new_tokens / target_calls if target_calls else None,
        "proposed_per_position": proposed_at,
        "accepted_per_position": accepted_at,
        "per_position": [a / p if p else None for a, p in zip(accepted_at, proposed_at)],
    }


def predicted_speedup(alpha: float, gamma: int, c: float, verify_ratio: float = 1.0) -> float:
    """Thm 3.8 with a measured verification cost.

    One iteration costs gamma draft steps (c each, in target-call units) and one target call
    over gamma + 1 tokens (verify_ratio = T(gamma+1) / T(1)); it yields E = (1 - alpha^(gamma+1)) / (1 - alpha)
    tokens on average. Speedup = E / (gamma c + verify_ratio). verify_ratio = 1 is the paper's
    Thm 3.8 exactly (`core.theory.walltime_improvement`).
    """
    if verify_ratio <= 0:
        raise ValueError(f"verify_ratio must be > 0, got {verify_ratio}")
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + verify_ratio)


def predicted_from_tokens_per_call(tokens_per_call: float, draft_cost: float, verify_ratio: float) -> float:
    """The cost model with measured tokens per target call and measured costs of one call.

    draft_cost: the runs' draft seconds per draft call over T(1); verify_ratio: T(k+1)/T(1) at the
    mean number k of tokens drafted per call. Separates the ways measurement departs from Thm 3.8:
    acceptance that is not i.i.d., drafts shorter than gamma (prompt lookup without a match, a draft
    model ending early), and costs the model leaves out (loop overhead).
    """
    if verify_ratio <= 0:
        raise ValueError(f"verify_ratio must be > 0, got {verify_ratio}")
    return tokens_per_call / (draft_cost + verify_ratio)


def interpolate_ratio(ratios: Mapping[int, float], k: float) -> float:
    """T(k)/T(1) at k, linearly interpolated (or held flat beyond the ends) between measured ks."""
    if not ratios:
        raise ValueError("no measured verification ratios")
    if k in ratios:
        return ratios[k]
    ks = sorted(ratios)
    if k <= ks[0]:
        return ratios[ks[0]]
    if k >= ks[-1]:
        return ratios[ks[-1]]
    hi = next(x for x in ks if x > k)
    lo = max(x for x in ks if x < k)
    return ratios[lo] + (ratios[hi] - ratios[lo]) * (k - lo) / (hi - lo)


def best_key(values: Mapping[T, float | None]) -> T | None:
    """The key with the largest value (ties go to the first in iteration order); None when all are None."""
    best, best_value = None, -math.inf
    for key, value in values.items():
        if value is not None and value > best_value:
            best, best_value = key, value
    return best


def group(records: Iterable[Mapping], key: Callable[[Mapping], Hashable]) -> dict[Hashable, list[Mapping]]:
    """Records grouped by key(record), groups in order of first appearance."""
    out: dict[Hashable, list[Mapping]] = {}
    for record in records:
        out.setdefault(key(record), []).append(record)
    return out
