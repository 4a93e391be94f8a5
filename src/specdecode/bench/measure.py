"""Interleaved measurement: for each prompt and temperature, baseline and methods in the order A B A C A ...

A *method* is anything that turns (prompt index, temperature, seed) into tokens and a wall time;
its *engine* names the plain decoding it is compared with (specdecode's target alone, or Hugging
Face `generate`). Each method run is compared with the baseline runs just before and after it,
so drift of a shared machine cancels; under greedy decoding its tokens must equal the baseline's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from specdecode.bench.stats import interleave, run_speedup

__all__ = ["Output", "Method", "Step", "timed", "run_step", "run_steps"]


@dataclass
class Output:
    """One generation: its new tokens, its wall time and, for specdecode runs, GenerationStats.to_dict()."""

    token_ids: list[int]
    seconds: float
    finish_reason: str | None = None
    stats: dict | None = None

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0


# (prompt index, temperature, seed[, limit: fewer new tokens, for warm-ups]) -> Output
Generate = Callable[..., Output]


@dataclass
class Method:
    label: str  # unique in a run, e.g. "ngram γ=4"
    engine: str  # the plain decoding it is compared with: "specdecode" or "hf"
    family: str  # "baseline", "specdecode" or "peer"
    drafter: str | None  # the drafter's name (specdecode) or the peer's
    gamma: int | None
    generate: Generate


@dataclass
class Step:
    """What runs on one prompt at one temperature on one engine: the baseline around each method."""

    prompt: int
    temperature: float
    baseline: Method
    methods: list[Method]
    seed: int
    info: dict  # copied into every record (question_id, category, in_sweep, ...)

    @property
    def order(self) -> list[Method]:
        """A B A C ... A; the baseline once when there is no method (it is then measured for itself)."""
        return interleave(self.baseline, self.methods) or [self.baseline]


def timed(run: Callable[[], tuple[list[int], str | None, dict | None]]) -> Output:
    """Call run() -> (token ids, finish reason, stats) and time it with the wall clock."""
    start = time.perf_counter()
    token_ids, finish_reason, stats = run()
    return Output(list(token_ids), time.perf_counter() - start, finish_reason, stats)


def _record(step: Step, method: Method, position: int, output: Output) -> dict:
    return {
        **step.info,
        "prompt": step.prompt,
        "temperature": step.temperature,
        "seed": step.seed,
        "engine": method.engine,
        "family": method.family,
        "role": "baseline" if method is step.baseline else "method",
        "method": method.label,
        "drafter": method.drafter,
        "gamma": method.gamma,
        "position": position,
        "seconds": output.seconds,
        "new_tokens": len(output.token_ids),
        "tokens_per_s": output.tokens_per_s,
        "finish_reason": output.finish_reason,
        "token_ids": output.token_ids,
        "stats": output.stats,
    }


def run_step(
    step: Step,
    on_record: Callable[[dict], None] = lambda record: None,
    on_mismatch: Callable[[dict], None] = lambda mismatch: None,
    on_run: Callable[[Method], None] = lambda method: None,
) -> tuple[list[dict], list[dict]]:
    """Run one step in interleaved order; return (records, greedy mismatches).

    Method records get `baseline_tokens_per_s` (the runs before and after), `speedup`, `decode_speedup`
    (the same after the first token, from specdecode stats; else None) and, at
    temperature 0, `identical` (tokens equal to the baseline run before it). At temperature 0
    every baseline run must also repeat the first one exactly.
    """
    order = step.order
    records = []
    for position, method in enumerate(order):
        output = method.generate(step.prompt, step.temperature, step.seed)
        on_run(method)
        records.append(_record(step, method, position, output))
        if method is not step.baseline:
            continue
        if position >= 2:  # the method before this baseline now has both neighbours
            _complete(records, position - 1, step, on_record, on_mismatch)
        on_record(records[-1])
    mismatches = [r["mismatch"] for r in records if r.get("mismatch")]
    return records, mismatches


def _complete(records: list[dict], i: int, step: Step, on_record, on_mismatch) -> None:
    record, before, after = records[i], records[i - 1], records[i + 1]
    record["baseline_tokens_per_s"] = [before["tokens_per_s"], after["tokens_per_s"]]
    record["speedup"] = run_speedup(record["tokens_per_s"], record["baseline_tokens_per_s"])
    record["decode_speedup"] = _decode_speedup(record, before, after)
    record["identical"] = None
    if step.temperature == 0:
        record["identical"] = record["token_ids"] == before["token_ids"]
        problems = []
        if not record["identical"]:
            at = _first_difference(record["token_ids"], before["token_ids"])
            problems.append(f"differs from the target alone at token {at}")
        if after["token_ids"] != records[0]["token_ids"]:
            problems.append("the target alone did not repeat its own greedy output")
        if problems:
            record["mismatch"] = {
                "method": record["method"],
                "engine": record["engine"],
                "prompt": step.prompt,
                **{k: step.info[k] for k in ("question_id", "category") if k in step.info},
                "problem": "; ".join(problems),
                "token_ids": record["token_ids"],
                "baseline_token_ids": before["token_ids"],
            }
            on_mismatch(record["mismatch"])
    on_record(record)


def _decode_speedup(record: dict, before: dict, after: dict) -> float | None:
    """The speedup after the first token (GenerationStats.decode_tokens_per_s); None without specdecode stats."""
    rates = [(r.get("stats") or {}).get("decode_tokens_per_s") for r in (record, before, after)]
    if any(rate is None for rate in rates):
        return None
    return run_speedup(rates[0], rates[1:])


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_steps(
    steps: Iterable[Step],
    on_record: Callable[[dict], None] = lambda record: None,
    on_mismatch: Callable[[dict], None] = lambda mismatch: None,
    on_step: Callable[[Step], None] = lambda step: None,
    on_run: Callable[[Method], None] = lambda method: None,
) -> tuple[list[dict], list[dict]]:
    """run_step over all steps; on_step is called after each (to save results incrementally)."""
    records, mismatches = [], []
    for step in steps:
        step_records, step_mismatches = run_step(step, on_record, on_mismatch, on_run)
        records += step_records
        mismatches += step_mismatches
        on_step(step)
    return records, mismatches
