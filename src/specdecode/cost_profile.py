"""A target's verification costs T(k), timed once per machine, engine and model and kept on disk.

The cost-aware draft length (`core.draft_length`) needs T(k) / T(1) for k = 1 .. max gamma + 1 on the
engine in use: flat on a memory-bound engine (the native fp32 one), about linear on llama.cpp's
quantized CPU kernels here. They are timed on the model itself after a 128-token context, each call keeping
one token as decoding does: each k in a run of calls of that k (as plain decoding runs k = 1), and each k
alternating with single tokens, whose excess over the runs is the cost of a call whose shape differs from
the last one's (llama.cpp rebuilds its compute graph then). A few seconds on SmolLM2-135M, once: cached
like the layout choice, under a key of the CPU, threads, engine, model and library versions.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import torch

from specdecode.core.draft_length import CostProfile
from specdecode.models.base import LanguageModel
from specdecode.timing_cache import cpu_name, read_timing, timing_file, write_timing

__all__ = ["measure_cost_profile", "measure_draft_costs", "engine_key"]

logger = logging.getLogger(__name__)

_CONTEXT = 128  # tokens in the cache before the timed calls (decoding verifies after a prompt and an answer)
_REPS = 5
_VERSION = 3  # bump when what is timed changes


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def engine_key(model: LanguageModel) -> dict:
    """What a model's speed depends on: the machine, the engine and its settings, the model and its file."""
    inner = getattr(model, "model", None)
    key = {
        "cpu": cpu_name(), "engine": type(model).__name__, "name": model.name,
        "threads": getattr(model, "threads", torch.get_num_threads()),
        "packing": getattr(model, "packing", None), "quantize": getattr(model, "quantize", None),
        "dtype": str(getattr(inner, "dtype", None)), "vocab": model.vocab_size,
        "torch": torch.__version__, "llama_cpp": _version("llama_cpp_python"),
    }
    path = Path(model.name)
    if path.is_file():  # a model file: another file under the same name is another model
        stat = path.stat()
        key["file"] = [stat.st_size, stat.st_mtime_ns]
    return key


def measure_cost_profile(model: LanguageModel, max_rows: int, reps: int = _REPS) -> CostProfile:
    """T(k) of `model` for k = 1 .. max_rows: read from the cache, or timed now and cached.

    Leaves the model's cache holding a short synthetic prompt (the next prefill replaces it).
    """
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be an integer >= 1, got {max_rows!r}")
    key = {**engine_key(model), "max_rows": max_rows, "version": _VERSION}
    path = timing_file("costs", key)
    record = read_timing(path, key)
    if record is not None:
        return CostProfile.from_dict(record)
    calls = 2 * (3 * reps + 1)  # the most calls one timed pattern makes, each keeping one token
    context_length = max(1, min(_CONTEXT, model.max_length - calls - max_rows - 1))
    context = torch.arange(context_length) % model.vocab_size
    ks = list(range(1, max_rows + 1))
    blocks = {k: _time_pattern(model, context, [k], 3 * reps)[k] for k in ks}
    switches = []
    for k in ks[1:]:  # a call of k rows between single tokens: what both cost beyond their blocks' times, each
        alternating = _time_pattern(model, context, [1, k], 3 * reps)
        switches.append((alternating[1] + alternating[k] - blocks[1] - blocks[k]) / 2)
    profile = CostProfile(blocks, max(0.0, statistics.median(switches)) if switches else 0.0)
    write_timing(path, key, profile.to_dict())
    logger.info("%s: T(k)/T(1) for k = 1..%d: %s (T(1) %.1f ms, a change of shape %.1f ms more)", model.name,
                max_rows, [round(profile.verify_ratio(k), 2) for k in ks], 1000 * profile.target_seconds[1],
                1000 * profile.switch_seconds)
    return profile


@torch.inference_mode()
def _time_pattern(model: LanguageModel, context: torch.Tensor, pattern: Sequence[int], reps: int) -> dict[int, float]:
    """Median seconds of extend(k tokens) for each k of `pattern`, the pattern run reps times after prefilling
    context [P] (once more untimed first). Each call keeps one token and rolls the rest back, as decoding does
    after a rejection (plain decoding, k = 1, rolls nothing back), so the context grows by one per call."""
    model.prefill(context)
    times: dict[int, list[float]] = {k: [] for k in pattern}
    for rep in range(reps + 1):
        for k in pattern:
            feed = context.repeat(-(-k // len(context)))[:k]
            start = time.perf_counter()
            model.extend(feed)
            elapsed = time.perf_counter() - start
            model.rollback(model.num_generated - (k - 1))
            if rep:
                times[k].append(elapsed)
    return {k: statistics.median(v) for k, v in times.items()}


def measure_draft_costs(target: LanguageModel, drafter, profile: CostProfile, gamma: int,
                        reps: int = _REPS) -> dict[str, float]:
    """c of each source of `drafter` that runs a model: its seconds per draft token over T(1), read from the
    cache or timed now (propose after a short prompt, medians) and cached. Prompt lookup costs 0: {}.

    Leaves the target's cache holding a short synthetic prompt (the next prefill replaces it).
    """
    from specdecode.drafters.base import draft_sources
    from specdecode.drafters.composite import LookupThenModelDrafter
    from specdecode.drafters.prompt_lookup import PromptLookupDrafter
    from specdecode.core.sampling import SamplingParams

    if isinstance(drafter, PromptLookupDrafter):
        return {}
    model_drafter = drafter.model if isinstance(drafter, LookupThenModelDrafter) else drafter
    key = {**engine_key(target), "drafter": model_drafter.name, "gamma": gamma, "version": _VERSION}
    path = timing_file("draft-costs", key)
    record = read_timing(path, key)
    if record is None:
        context = torch.arange(max(2, min(_CONTEXT, target.max_length - gamma - 2))) % target.vocab_size
        first = torch.tensor([int(context[-1])])
        target.prefill(context)
        model_drafter.start(context)
        per_token = []
        for rep in range(reps + 1):
            start = time.perf_counter()
            draft = model_drafter.propose(first, gamma, SamplingParams(0.0), None)
            elapsed = time.perf_counter() - start
            if rep and len(draft):
                per_token.append(elapsed / len(draft))
        c = statistics.median(per_token) / profile.target_seconds[1] if per_token else 0.0
        record = {"c": c}
        write_timing(path, key, record)
        logger.info("draft %s: c = %.3f of a target step per draft token", model_drafter.name, c)
    return {source: record["c"] for source in draft_sources(model_drafter)}


_PASS_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the row counts a pass is timed at (linear in between)


def measure_pass_costs(engine, single: LanguageModel, max_rows: int, reps: int = 2):
    """P(R): the seconds of one pass of a `native.batching.BatchedNativeLM` over R rows, spread over
    min(R, max_batch) sequences each after a 128-token context, for R up to max_rows; cached under `single`'s
    engine key (the model the batch shares) with the batch's size. No sequence may be open meanwhile.
    """
    from specdecode.core.batch_costs import PassCosts
    from specdecode.native.slots import SlotRows

    key = {**engine_key(single), "max_batch": engine.max_batch, "max_rows": max_rows, "version": 1}
    path = timing_file("pass-costs", key)
    record = read_timing(path, key)
    if record is not None:
        return PassCosts.from_dict(record)
    if engine.open_sequences:
        raise RuntimeError("measure_pass_costs needs a batch without open sequences")
    context_length = max(1, min(_CONTEXT, engine.max_length - max_rows - 1))
    context = torch.arange(context_length) % engine.vocab_size
    with torch.inference_mode():
        for s in range(min(engine.max_batch, max_rows)):
            engine.forward([SlotRows(s, context, 0, last_only=True)])
        seconds = {}
        for rows in sorted({r for r in _PASS_ROWS if r <= max_rows} | {max_rows}):
            count = min(rows, engine.max_batch)
            per = [rows // count + (i < rows % count) for i in range(count)]
            batch = [SlotRows(s, context[:n], context_length) for s, n in enumerate(per)]
            times = []
            for rep in range(reps + 1):
                start = time.perf_counter()
                engine.forward(batch)
                if rep:
                    times.append(time.perf_counter() - start)
            seconds[rows] = statistics.median(times)
    costs = PassCosts(seconds)
    write_timing(path, key, costs.to_dict())
    logger.info("%s: a pass of R rows: %s", single.name,
                {r: f"{1000 * t:.1f} ms" for r, t in sorted(seconds.items())})
    return costs
