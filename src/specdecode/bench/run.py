"""`run_bench`: load the models, plan the interleaved steps, measure, and write results incrementally.

Phases: load target and drafts; warm up; (for unigram/bigram) the target's greedy reference
outputs, which the leave-one-out fits use; extend timings for c and T(k)/T(1); the HF peers;
then every prompt x temperature step, saving results.json, runs.jsonl and report.md after each.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from specdecode import backends
from specdecode.bench import plots, report
from specdecode.bench.config import STATISTICAL_DRAFTS, BenchConfig, default_drafts
from specdecode.bench.costs import summarize_costs, time_extend
from specdecode.bench.measure import Method, Step, run_steps
from specdecode.bench.methods import FIT_CORPUS, LeaveOneOut, model_of, speculative, target_alone
from specdecode.bench.peers import Unavailable, hf_peers, is_hf_model
from specdecode.bench.prompts import load_prompts, select, spread_subset
from specdecode.bench.summary import summarize
from specdecode.pipeline import Pipeline, expected_engine, make_drafter, verification_rows

__all__ = ["run_bench", "write_outputs", "machine_description"]

RESULTS, RUNS, REPORT = "results.json", "runs.jsonl", "report.md"


def machine_description() -> dict:
    """The machine and the versions of the libraries that matter for speed."""
    versions = {}
    for package in ("specdecode", "torch", "transformers", "tokenizers", "numpy", "matplotlib"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory = None
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(memory, 1) if memory else None,
        "python": platform.python_version(),
        "versions": versions,
    }


def _write_json(path: Path, data: dict) -> None:
    """Write atomically: an interrupted write never leaves a half file."""
    staging = path.with_suffix(path.suffix + ".tmp")
    staging.write_text(json.dumps(data, indent=1, default=str))
    staging.replace(path)


def write_outputs(results: dict, out: Path, with_plots: bool = True) -> None:
    """results.json (with a fresh summary), report.md and, with_plots, the PNG plots."""
    results["summary"] = summarize(results["runs"], results.get("costs"))
    if with_plots:
        results["plots"] = plots.write_plots(results, out)
    _write_json(out / RESULTS, results)
    (out / REPORT).write_text(report.render(results))


def _warn(message: str) -> None:
    try:
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)
    except ImportError:  # pragma: no cover
        print(message, file=sys.stderr)


def run_bench(config: BenchConfig, log: Callable[[str], None] = _warn) -> dict:
    """Run the benchmark of `config`; return results (as written to config.out/results.json)."""
    cfg = config.resolved()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    prompts = select(load_prompts(cfg.prompts), cfg.per_category, cfg.categories)
    defaulted = cfg.drafts == default_drafts(cfg.target, cfg.backend)  # not named by the user (or named as the default)
    cfg = _fittable(cfg, defaulted, min(len(prompts), cfg.limit or len(prompts)), log)  # before the (slow) load
    log(f"bench: loading {cfg.target} ({cfg.backend}) and drafts {', '.join(cfg.drafts)}")
    # the target's layout is chosen for the per-category drafts' verification at the headline gamma (the most
    # tokens per call any of them feeds); the baseline runs on the same one
    rows = max((verification_rows(d, cfg.gamma, cfg.min_confidence, cfg.target, expected_engine(cfg.backend))
                for d in cfg.category_drafts), default=cfg.gamma + 1)
    # drafts are compared on one engine: 'auto' is the native engine where it runs the target (the bundled EAGLE
    # draft needs it), not the fastest engine; `python -m specdecode.bench.engines` compares the engines
    backend = "native" if cfg.backend == "auto" and backends.native_supports(cfg.target) else cfg.backend
    pipeline = Pipeline.load(cfg.target, draft="none", gamma=cfg.gamma, backend=backend, packing=cfg.packing,
                             rows_per_call=rows)
    prompts, encoded, skipped, sweep = _prepare(cfg, pipeline, prompts, log)
    cfg = _fittable(cfg, defaulted, len(prompts), log)  # a prompt too long for the context may have left one
    model_specs = [d for d in cfg.drafts if d not in STATISTICAL_DRAFTS]
    drafters = {spec: make_drafter(spec, pipeline.target, cfg.backend, cfg.min_confidence) for spec in model_specs}
    cfg = _drop_duplicates(cfg, drafters, log)
    baseline = target_alone(pipeline, encoded, cfg.max_new_tokens)

    results: dict = {
        "format": 1,
        "command": cfg.command,
        "config": cfg.to_dict(),
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
        "machine": machine_description(),
        "target_packing": getattr(pipeline.target.model, "packing", None),  # what packing='auto' chose; None on HF
        "target_layout": _layout_choice(pipeline),
        "prompts": [
            {"index": i, "question_id": p.question_id, "category": p.category, "prompt_tokens": len(encoded[i]),
             "in_sweep": i in sweep}
            for i, p in enumerate(prompts)
        ],
        "skipped": skipped,
        "fit_corpus": FIT_CORPUS if any(d in STATISTICAL_DRAFTS for d in cfg.drafts) else None,
        "drafters": {spec: getattr(d, "name", spec) for spec, d in drafters.items()},
        "costs": None,
        "unavailable": [],
        "reference": [],
        "runs": [],
        "mismatches": [],
    }
    runs_file = (out / RUNS).open("w")
    try:
        return _measure(cfg, results, out, runs_file, prompts, encoded, sweep, pipeline, drafters, baseline, log, started)
    finally:
        runs_file.close()


def _layout_choice(pipeline: Pipeline) -> dict | None:
    """How packing='auto' chose the native target's layout by timing (`LayoutChoice`), or None."""
    choice = getattr(pipeline.target.model, "layout_choice", None)
    return None if choice is None else choice.to_dict()


def _prepare(cfg: BenchConfig, pipeline: Pipeline, prompts: list, log) -> tuple[list, list, list[dict], set[int]]:
    """Encode the prompts; drop those that do not fit the context; apply --limit; choose the sweep prompts."""
    encoded = [pipeline.encode(p.text, cfg.chat) for p in prompts]  # each [P_i]
    context = pipeline.target.model.max_length
    fits = [i for i, e in enumerate(encoded) if len(e) + cfg.max_new_tokens + max(cfg.gammas) + 1 <= context]
    skipped = [{"question_id": p.question_id, "category": p.category, "prompt_tokens": len(encoded[i]),
                "reason": f"it does not fit the target's context of {context} with {cfg.max_new_tokens} new tokens"}
               for i, p in enumerate(prompts) if i not in fits]
    for skip in skipped:
        log(f"bench: skipping question {skip['question_id']} ({skip['category']}): {skip['reason']}")
    prompts, encoded = [prompts[i] for i in fits], [encoded[i] for i in fits]
    if not prompts:
        raise ValueError("prompts: no prompt fits the target's context window")
    if cfg.limit and cfg.limit < len(prompts):
        keep = spread_subset(prompts, cfg.limit, [len(e) for e in encoded])
        prompts, encoded = [prompts[i] for i in keep], [encoded[i] for i in keep]
    sweep = set(spread_subset(prompts, cfg.sweep_prompts, [len(e) for e in encoded]))
    return prompts, encoded, skipped, sweep


def _fittable(cfg: BenchConfig, defaulted: bool, prompts: int, log) -> BenchConfig:
    """unigram and bigram are fitted on the other prompts' outputs: with one prompt they would be fitted on
    nothing. Refused when asked for by name; dropped, with a line in the log, from the default drafts."""
    fitted = [d for d in cfg.drafts if d in STATISTICAL_DRAFTS]
    if prompts > 1 or not fitted:
        return cfg
    why = (f"{' and '.join(fitted)} {'are' if len(fitted) > 1 else 'is'} fitted on the other prompts' greedy outputs "
           "(leave-one-out), which needs at least 2 prompts; this run has 1")
    if not defaulted:
        raise ValueError(f"drafts: {why}")
    if any(d in STATISTICAL_DRAFTS for d in cfg.category_drafts):
        raise ValueError(f"category_drafts: {why}")
    log(f"bench: no {' or '.join(fitted)} draft: {why}")
    return replace(cfg, drafts=tuple(d for d in cfg.drafts if d not in STATISTICAL_DRAFTS))


def _drop_duplicates(cfg: BenchConfig, drafters: dict, log) -> BenchConfig:
    """Drop a draft name that resolves to the same drafter as an earlier one (e.g. 'auto' meaning 'ngram')."""
    seen: dict[str, str] = {}  # drafter name -> the draft name kept
    kept_for: dict[str, str] = {}  # dropped draft name -> the one measured in its place
    for spec in list(drafters):
        name = getattr(drafters[spec], "name", spec)
        if name not in seen:
            seen[name] = spec
            continue
        if seen[name] == "auto":  # keep the explicit name
            dropped, seen[name] = seen[name], spec
        else:
            dropped = spec
        del drafters[dropped]
        kept_for[dropped] = seen[name]
        log(f"bench: draft {dropped!r} is the same drafter as {seen[name]!r} ({name}): measured once")

    def kept(names: tuple[str, ...]) -> tuple[str, ...]:
        """names with each dropped draft replaced by the one measured in its place, each once."""
        renamed = (kept_for.get(d, d) for d in names)
        return tuple(dict.fromkeys(d for d in renamed if d in drafters or d in STATISTICAL_DRAFTS))

    return replace(cfg, drafts=kept(cfg.drafts), category_drafts=kept(cfg.category_drafts))


def _measure(cfg, results, out, runs_file, prompts, encoded, sweep, pipeline, drafters, baseline, log, started) -> dict:
    from tqdm import tqdm

    statistical = _warm_up_and_fit(cfg, results, prompts, encoded, pipeline, drafters, baseline, log)
    results["costs"] = _costs(cfg, pipeline, drafters, encoded, log)
    hf_plain, peer_methods = _peers(cfg, results, pipeline, drafters, encoded, log)

    def drafter_for(name: str):
        if name in statistical:
            return statistical[name]
        return lambda prompt, d=drafters[name]: d

    methods = {(d, g): speculative(d, pipeline, drafter_for(d), g, encoded, cfg.max_new_tokens)
               for d in cfg.drafts for g in cfg.gammas}
    steps = _plan(cfg, prompts, sweep, baseline, methods, hf_plain, peer_methods)
    _write_json(out / RESULTS, results)

    def on_record(record: dict) -> None:
        results["runs"].append(record)
        runs_file.write(json.dumps(record) + "\n")
        runs_file.flush()

    def on_mismatch(mismatch: dict) -> None:
        results["mismatches"].append(mismatch)
        log(f"!!! GREEDY OUTPUT MISMATCH: {mismatch['method']} on prompt {mismatch['prompt']} "
            f"({mismatch.get('category')}): {mismatch['problem']}")

    if results["reference"]:
        log(f"bench: {sum(len(s.order) for s in steps)} runs; at least {_estimate(steps, results['reference']) / 60:.0f} min "
            "(at the target alone's speed; weak drafts and HF runs are slower)")
    bar = tqdm(total=sum(len(s.order) for s in steps), desc="bench", unit="run", disable=None)

    def on_step(step: Step) -> None:
        results["wall_seconds"] = time.perf_counter() - started
        write_outputs(results, out, with_plots=False)

    try:
        run_steps(steps, on_record, on_mismatch, on_step,
                  on_run=lambda method: (bar.update(1), bar.set_postfix_str(method.label, refresh=False)))
    except KeyboardInterrupt:
        results["interrupted"] = True
        log("bench: interrupted; writing what was measured")
        raise
    else:
        results["complete"] = True
    finally:
        bar.close()
        results["wall_seconds"] = time.perf_counter() - started
        results["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        write_outputs(results, out)
    log(f"bench: done in {results['wall_seconds']:.0f} s; wrote {out / RESULTS}, {out / REPORT} and plots")
    return results


def _warm_up_and_fit(cfg, results, prompts, encoded, pipeline, drafters, baseline, log) -> dict[str, LeaveOneOut]:
    """Warm every engine up; for unigram/bigram, record the target's greedy outputs and fit on them."""
    from tqdm import tqdm

    # Warm-up: first-call costs (allocation, lazy initialisation) land in no timing.
    baseline.generate(0, 0.0, cfg.seed, limit=4)
    for spec in drafters:
        speculative(spec, pipeline, lambda i, d=drafters[spec]: d, cfg.gamma, encoded, 4).generate(0, 0.0, cfg.seed)

    # The target's greedy outputs, for the leave-one-out unigram/bigram fits.
    statistical = {}
    if any(d in STATISTICAL_DRAFTS for d in cfg.drafts):
        log(f"bench: target's greedy outputs on the {len(prompts)} prompts (the unigram/bigram fit corpus)")
        for i in tqdm(range(len(prompts)), desc="reference", unit="prompt", disable=None, leave=False):
            ref = baseline.generate(i, 0.0, cfg.seed + i)
            results["reference"].append({"prompt": i, "token_ids": ref.token_ids, "seconds": ref.seconds})
        corpus = [r["token_ids"] for r in results["reference"]]
        vocab = pipeline.target.model.vocab_size
        statistical = {kind: LeaveOneOut(kind, corpus, vocab) for kind in STATISTICAL_DRAFTS if kind in cfg.drafts}
    return statistical


def _estimate(steps: list[Step], reference: list[dict]) -> float:
    """Seconds the steps should take if every run took the target alone's reference time (HF runs twice that)."""
    seconds = {r["prompt"]: r["seconds"] for r in reference}
    return sum(len(s.order) * seconds[s.prompt] * (2 if s.baseline.engine == "hf" else 1) for s in steps)


def _costs(cfg: BenchConfig, pipeline: Pipeline, drafters: dict, encoded: list, log) -> dict:
    """c and T(k)/T(1) on the median-length prompt."""
    models = {"target": pipeline.target.model}
    ks = {"target": list(range(1, max(cfg.gammas) + 2))}
    for spec, drafter in drafters.items():
        model = model_of(drafter)
        if model is not None:
            models[spec], ks[spec] = model, [1]
    lengths = [len(e) for e in encoded]
    context = encoded[lengths.index(sorted(lengths)[len(lengths) // 2])]
    log(f"bench: timing extend on a {len(context)}-token context ({', '.join(models)})")
    times = time_extend(models, context, ks, cfg.cost_reps)
    return {**summarize_costs(times), "context_tokens": len(context), "reps": cfg.cost_reps,
            "seconds": {name: {str(k): v for k, v in per_k.items()} for name, per_k in times.items()}}


def _peers(cfg, results, pipeline, drafters, encoded, log) -> tuple[Method | None, list[Method]]:
    """HF plain generate and the peers that run; the rest go to results['unavailable'] with the reason."""
    if not cfg.peers:
        return None, []
    target = pipeline.target.hf_model
    if not is_hf_model(target):
        try:
            target = backends.load(cfg.target, "hf").hf_model
        except Exception as error:  # noqa: BLE001 - the peers are then listed as not applicable
            results["unavailable"] += [Unavailable(p, f"the target does not load in transformers ({error})").to_dict()
                                      for p in ("HF generate", *cfg.peers)]
            return None, []
    model_drafts = [spec for spec, d in drafters.items() if model_of(d) is not None]
    others = [d for d in cfg.drafts if d not in model_drafts]
    plain, methods, unavailable = hf_peers(target, cfg.peers, model_drafts, others, cfg.gamma, encoded,
                                           cfg.max_new_tokens, pipeline.eos_token_ids())
    runnable = []
    for method in [plain, *methods]:
        try:
            method.generate(0, 0.0, cfg.seed, limit=4)  # warm-up, and a check that HF runs this configuration
        except Exception as error:  # noqa: BLE001 - a peer that cannot run is listed with its reason
            if method is plain:
                results["unavailable"] += [Unavailable(m.label, f"HF generate fails on this target ({error})").to_dict()
                                          for m in [plain, *methods]]
                return None, []
            unavailable.append(Unavailable(method.label, f"generate raised {type(error).__name__}: {error}"))
            continue
        runnable.append(method)
    results["unavailable"] += [u.to_dict() for u in unavailable]
    for u in unavailable:
        log(f"bench: peer {u.method}: not applicable: {u.reason}")
    return plain, runnable[1:]


def _plan(cfg, prompts, sweep, baseline, methods, hf_plain, peer_methods) -> list[Step]:
    """Per prompt and temperature: specdecode's step (category drafts at gamma, plus the sweep on sweep
    prompts) and, on sweep prompts, the HF step."""
    steps = []
    for i, prompt in enumerate(prompts):
        info = {"question_id": prompt.question_id, "category": prompt.category, "in_sweep": i in sweep}
        for temperature in cfg.temperatures:
            chosen = [methods[(d, cfg.gamma)] for d in cfg.category_drafts]
            if i in sweep:
                chosen += [m for (d, g), m in methods.items() if m not in chosen]
            if chosen:
                steps.append(Step(i, temperature, baseline, chosen, cfg.seed + i, info))
            if i in sweep and hf_plain is not None:
                steps.append(Step(i, temperature, hf_plain, peer_methods, cfg.seed + i, info))
    return steps

