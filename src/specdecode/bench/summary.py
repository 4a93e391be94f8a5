"""From run records to the numbers the report shows: rows per method, temperature and scope.

Scopes: "overall" (every prompt the method ran on), "category" (one category), "sweep" (only the
sweep prompts, so every gamma is compared on the same prompts). Pure: records in, dicts out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from specdecode.bench.stats import (
    best_key,
    group,
    interpolate_ratio,
    pool_acceptance,
    predicted_from_tokens_per_call,
    predicted_speedup,
    spread,
)
from specdecode.core.theory import optimal_gamma, walltime_improvement

__all__ = ["summarize", "cost_ratio", "verify_ratios"]


def verify_ratios(costs: Mapping | None) -> dict[int, float]:
    """T(k)/T(1) by int k (results.json stores the keys as strings)."""
    return {int(k): float(v) for k, v in (costs or {}).get("verify_ratio", {}).items()}


def cost_ratio(costs: Mapping | None, drafter: str | None, acceptance: Mapping | None, gamma: int | None) -> tuple[float | None, str | None]:
    """(c, how it was measured) for a drafter: its model's extend time, else its measured draft time per position."""
    if not costs or drafter is None:
        return None, None
    if drafter in costs.get("c", {}):
        return float(costs["c"][drafter]), "extend"
    if acceptance and acceptance.get("draft_calls") and gamma:
        per_position = acceptance["draft_seconds"] / acceptance["draft_calls"] / gamma
        return per_position / costs["target_t1"], "run"
    return None, None


def _row(records: Sequence[Mapping], costs: Mapping | None, **keys) -> dict:
    first = records[0]
    gamma = first["gamma"]
    stats = [r["stats"] for r in records if r.get("stats") and r["family"] == "specdecode"]
    acceptance = pool_acceptance(stats) if stats else None
    greedy = [r for r in records if r.get("identical") is not None]
    row = {
        **keys,
        "method": first["method"],
        "engine": first["engine"],
        "family": first["family"],
        "drafter": first["drafter"],
        "gamma": gamma,
        "temperature": first["temperature"],
        "runs": len(records),
        "prompts": len({r["prompt"] for r in records}),
        "speedup": spread(r.get("speedup") for r in records),
        "decode_speedup": spread(r.get("decode_speedup") for r in records),
        "tokens_per_s": spread(r["tokens_per_s"] for r in records),
        "baseline_tokens_per_s": spread(statistics.fmean(r["baseline_tokens_per_s"]) for r in records if r.get("baseline_tokens_per_s")),
        "acceptance": acceptance,
        "greedy_runs": len(greedy),
        "identical": sum(bool(r["identical"]) for r in greedy),
    }
    row.update(_prediction(row, costs))
    return row


def _prediction(row: Mapping, costs: Mapping | None) -> dict:
    out = dict(c=None, c_source=None, c_run=None, verify_ratio=None, predicted=None, predicted_ideal=None,
               predicted_from_tokens_per_call=None, measured_over_predicted=None)
    acceptance, gamma = row["acceptance"], row["gamma"]
    if acceptance is None or gamma is None or not costs:
        return out
    c, source = cost_ratio(costs, row["drafter"], acceptance, gamma)
    ratios = verify_ratios(costs)
    if c is None or not ratios:
        return out
    out.update(c=c, c_source=source, verify_ratio=interpolate_ratio(ratios, gamma + 1))
    out["c_run"] = cost_ratio({**costs, "c": {}}, row["drafter"], acceptance, gamma)[0]  # the draft time actually spent
    if acceptance["tokens_per_call"] is not None and acceptance.get("draft_calls"):
        calls = acceptance["draft_calls"]
        draft_cost = acceptance["draft_seconds"] / calls / costs["target_t1"]
        out["predicted_from_tokens_per_call"] = predicted_from_tokens_per_call(
            acceptance["tokens_per_call"], draft_cost, interpolate_ratio(ratios, 1 + acceptance["draft_tokens"] / calls))
    if acceptance["alpha"] is not None:
        out["predicted"] = predicted_speedup(acceptance["alpha"], gamma, c, out["verify_ratio"])
        out["predicted_ideal"] = walltime_improvement(acceptance["alpha"], gamma, c)
        measured = row["speedup"]["median"]
        out["measured_over_predicted"] = measured / out["predicted"] if measured and out["predicted"] else None
    return out


def _best_gammas(sweep_rows: Sequence[Mapping], sweep_records: Sequence[Mapping], costs: Mapping | None) -> list[dict]:
    """Per drafter and temperature: the measured best gamma and the one Thm 3.8 predicts."""
    out = []
    by_drafter = group(sweep_rows, lambda r: (r["family"], r["drafter"], r["temperature"]))
    for (family, drafter, temperature), rows in by_drafter.items():
        measured = best_key({r["gamma"]: r["speedup"]["median"] for r in rows})
        entry = {"family": family, "drafter": drafter, "temperature": temperature, "measured": measured,
                 "predicted": None, "ideal": None, "alpha": None, "c": None, "curve": {}}
        stats = [r["stats"] for r in sweep_records
                 if r["drafter"] == drafter and r["temperature"] == temperature and r.get("stats") and r["family"] == family]
        ratios = verify_ratios(costs)
        if family == "specdecode" and stats and ratios:
            pooled = pool_acceptance(stats)
            gammas = [r["gamma"] for r in rows]
            c = _curve_cost(costs, drafter, [r for r in sweep_records if r["drafter"] == drafter
                                             and r["temperature"] == temperature and r.get("stats")])
            if pooled["alpha"] is not None and c is not None:
                top = max(ratios) - 1  # T(k) is measured up to k = max gamma + 1
                curve = {g: predicted_speedup(pooled["alpha"], g, c, interpolate_ratio(ratios, g + 1))
                         for g in range(1, max(top, max(gammas)) + 1)}
                entry.update(alpha=pooled["alpha"], c=c, curve=curve, predicted=best_key(curve),
                             ideal=optimal_gamma(pooled["alpha"], c))
        out.append(entry)
    return out


def _curve_cost(costs: Mapping, drafter: str, records: Sequence[Mapping]) -> float | None:
    """c for a whole gamma curve: the draft model's extend ratio, else draft seconds per drafted position over all runs."""
    if drafter in costs.get("c", {}):
        return float(costs["c"][drafter])
    positions = sum(r["stats"]["draft_calls"] * r["gamma"] for r in records)
    seconds = sum(r["stats"]["draft_seconds"] for r in records)
    return seconds / positions / costs["target_t1"] if positions else None


def _noise(records: Sequence[Mapping]) -> dict:
    """Run-to-run spread of the baseline: per (engine, prompt, temperature), max |tokens/s / median - 1|."""
    out = {}
    baselines = [r for r in records if r["role"] == "baseline"]
    for engine, rows in group(baselines, lambda r: r["engine"]).items():
        deviations = []
        for runs in group(rows, lambda r: (r["prompt"], r["temperature"])).values():
            rates = [r["tokens_per_s"] for r in runs if r["tokens_per_s"] > 0]
            if len(rates) >= 2:
                median = statistics.median(rates)
                deviations.append(max(abs(x / median - 1) for x in rates))
        out[engine] = spread(deviations)
    return out


def _engines(records: Sequence[Mapping]) -> dict | None:
    """HF plain generate against specdecode's target alone, tokens/s on the prompts both ran."""
    base = [r for r in records if r["role"] == "baseline"]
    by = group(base, lambda r: (r["prompt"], r["temperature"], r["engine"]))
    ratios = []
    for (prompt, temperature, engine), runs in by.items():
        if engine != "hf" or (prompt, temperature, "specdecode") not in by:
            continue
        hf = statistics.median(r["tokens_per_s"] for r in runs)
        ours = statistics.median(r["tokens_per_s"] for r in by[(prompt, temperature, "specdecode")])
        if hf > 0:
            ratios.append(ours / hf)
    return spread(ratios) if ratios else None


def summarize(records: Sequence[Mapping], costs: Mapping | None = None) -> dict:
    """Every table's numbers from the run records (reference runs are ignored)."""
    measured = [r for r in records if r.get("role") == "method"]
    rows = []
    for (method, temperature), runs in group(measured, lambda r: (r["method"], r["temperature"])).items():
        rows.append(_row(runs, costs, scope="overall", category=None))
        for category, in_category in group(runs, lambda r: r.get("category")).items():
            rows.append(_row(in_category, costs, scope="category", category=category))
        in_sweep = [r for r in runs if r.get("in_sweep")]
        if in_sweep:
            rows.append(_row(in_sweep, costs, scope="sweep", category=None))
    sweep_rows = [r for r in rows if r["scope"] == "sweep"]
    sweep_records = [r for r in measured if r.get("in_sweep")]
    drafters = []
    for (drafter, temperature), runs in group(
        [r for r in measured if r["family"] == "specdecode"], lambda r: (r["drafter"], r["temperature"])
    ).items():
        pooled = pool_acceptance(r["stats"] for r in runs if r.get("stats"))
        drafters.append({"drafter": drafter, "temperature": temperature, "runs": len(runs), "acceptance": pooled})
    return {
        "rows": rows,
        "best_gamma": _best_gammas(sweep_rows, sweep_records, costs),
        "drafters": drafters,
        "baseline_noise": _noise(records),
        "specdecode_over_hf_plain": _engines(records),
    }
