"""Replay greedy decoding with an EAGLE draft and prompt lookup at several (gamma, min_confidence) settings, per category.

    python scripts/draft_length_replay.py --settings 2:0,5:0.6        # the bundled draft, ../shared/data/spec_bench_dev.jsonl

What `--draft X+ngram` does at T=0, replayed on the target's greedy answers (the same answers and features as
scripts/spec_bench_alpha.py keeps in --out) instead of decoded: each call, prompt lookup (a match of 3-4
tokens) proposes up to gamma copied tokens; where it finds none, the draft proposes its argmax at draft
positions 1, 2, ... up to gamma, ending after a token whose q (the softmax of its logits) is below
min_confidence. The k-th draft token is the network's teacher-forced prediction at depth k (the k - 1 before
it being the answer's own, `EagleObjective.logits_by_depth`), which is what the drafter computes wherever the
tokens before it were accepted; so the accepted tokens, target calls and tokens per call are decoding's (up to
float rounding of the batched features), and only the length of drafts whose earlier tokens were rejected, or
that run past an answer's EOS (counted without an early end there), is approximate. The predictions are the
draft's float32 weights' (decoding drafts on int8 where the kernel runs: alpha within 0.006, docs/distill.md).
The time of a call is the target's T(draft tokens + 1) plus the draft's time for its model tokens, both timed
here as `generate --draft auto` runs them (the target's layout chosen for 3-token calls, the draft on int8
weights where the kernel runs); the predicted speedup of an answer is its length times T(1) over that, the
prefill counted as one T(1) in both. Greedy only: at T > 0 acceptance is random.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from collections.abc import Iterator
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_bench_alpha import add_answer_options, answers_and_features, draft_directory  # noqa: E402

from specdecode import backends  # noqa: E402
from specdecode.bench.costs import summarize_costs, time_extend  # noqa: E402
from specdecode.core.sampling import SamplingParams  # noqa: E402
from specdecode.distill.eagle import EagleObjective  # noqa: E402
from specdecode.distill.teacher import TeacherData  # noqa: E402
from specdecode.distill.train import make_batches  # noqa: E402
from specdecode.drafters.base import check_min_confidence  # noqa: E402
from specdecode.drafters.eagle import EagleDrafter, load_eagle  # noqa: E402
from specdecode.drafters.prompt_lookup import find_continuation  # noqa: E402
from specdecode.pipeline import EARLY_END_ROWS_PER_CALL, eagle_drafter  # noqa: E402

LOOKUP = (3, 4)  # the n-gram sizes of `X+ngram` (LookupThenModelDrafter's defaults)


class Call(NamedTuple):
    """One target call of the replay: draft tokens proposed, how many came from the model draft, tokens added."""

    drafted: int
    model_tokens: int
    new_tokens: int


def depth_logits(network, embedding: torch.Tensor, data: TeacherData, features: list[torch.Tensor], depth: int,
                 batch_tokens: int = 4096) -> Iterator[tuple[list[int], torch.Tensor, list[torch.Tensor]]]:
    """Batches of answers: their indices, ids [B, L] (zero-padded) and the draft's logits by depth, depth x [B, L, K]
    (`EagleObjective.logits_by_depth`: at depth d + 1, position j predicts token j + 1, the d before it the answer's)."""
    objective = EagleObjective(network, embedding, features)
    with torch.no_grad():
        for indices in make_batches([len(t) for t in data.ids], batch_tokens, random.Random(0)):
            ids = data.padded_ids(indices)
            yield indices, ids, objective.logits_by_depth(indices, ids, depth)


def draft_predictions(network, output_ids: torch.Tensor, embedding: torch.Tensor, data: TeacherData,
                      features: list[torch.Tensor], depth: int, batch_tokens: int = 4096) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per answer: argmax token ids [depth, L] and their q [depth, L] at every position, teacher forced."""
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(data)
    for indices, _, logits in depth_logits(network, embedding, data, features, depth, batch_tokens):
        q = torch.stack([torch.softmax(x.float(), dim=-1) for x in logits])
        confidence, rows = q.max(dim=-1)  # [depth, B, L]
        for row, i in enumerate(indices):
            n = len(data.ids[i])
            out[i] = (output_ids[rows[:, row, :n]], confidence[:, row, :n])
    return out


def accepted_prefix(ids: torch.Tensor, n: int, draft: list[int]) -> int:
    """How many tokens of a draft proposed after ids[:n] are the answer's own next tokens (greedy verification)."""
    accepted = 0
    while accepted < len(draft) and n + accepted < len(ids) and draft[accepted] == int(ids[n + accepted]):
        accepted += 1
    return accepted


def replay(ids: torch.Tensor, first: int, tokens: torch.Tensor, confidence: torch.Tensor, gamma: int,
           min_confidence: float, max_new_tokens: int) -> list[Call]:
    """The target calls after the prefill of greedy decoding of the answer in ids [L] (prompt ids[: first + 1]).

    tokens, confidence [D, L] (D >= gamma): the draft's argmax and its q at depth d + 1, position j.
    """
    answer = len(ids) - first - 1
    generated, calls = 1, []  # the prefill gave the first answer token
    while generated < answer:
        n = first + 1 + generated  # tokens known: the target runs from position n - 1
        g = min(gamma, max_new_tokens - generated - 1)
        draft = find_continuation(ids[:n], g, LOOKUP[1], LOOKUP[0]).tolist() if g > 0 else []
        model_tokens = 0
        if g > 0 and not draft:
            for k in range(g):
                j = n - 1 + k  # the position the k-th draft token is predicted at
                if j >= len(ids):  # past the answer's end (an EOS): decoding drafts on, tokens unknown here and
                    draft.append(-1)  # never accepted; counted without an early end (exact at min_confidence 0)
                    continue
                draft.append(int(tokens[k, j]))
                if float(confidence[k, j]) < min_confidence:
                    break
            model_tokens = len(draft)
        new = min(accepted_prefix(ids, n, draft) + 1, answer - generated)
        calls.append(Call(len(draft), model_tokens, new))
        generated += new
    return calls


def draft_seconds(drafter: EagleDrafter, target, context: torch.Tensor, gamma: int, reps: int) -> dict[int, float]:
    """Median seconds of one proposal of m = 1 .. gamma tokens after context [P] (greedy, no early end)."""
    target.prefill(context[:-1])
    target.extend(context[-1:])
    drafter.start(context[:-1])
    times: dict[int, list[float]] = {m: [] for m in range(1, gamma + 1)}
    for rep in range(reps + 1):
        for m in times:
            start = time.perf_counter()
            drafter.propose(context[-1:], m, SamplingParams(0.0), None)
            if rep > 0:
                times[m].append(time.perf_counter() - start)
    return {m: statistics.median(v) for m, v in times.items()}


def measured_costs(target_name: str, directory: str, data: TeacherData, ks: range, depth: int,
                   reps: int) -> tuple[dict[int, float], dict[int, float]]:
    """T(k)/T(1) for k in ks, and the draft's seconds of m = 1 .. depth tokens over T(1): timed as
    `generate --draft auto` runs the target (layout chosen for 3-token calls) and the draft (int8 where it runs)."""
    loaded = backends.load(target_name, "native", "auto", EARLY_END_ROWS_PER_CALL)  # the EAGLE draft reads its features
    drafter = eagle_drafter(directory, loaded, min_confidence=0.0)
    context = torch.cat(list(data.ids))[: min(256, loaded.model.max_length // 2)]  # a context of decoding's length
    costs = summarize_costs(time_extend({"target": loaded.model}, context, {"target": ks}, reps))
    seconds = draft_seconds(drafter, loaded.model, context, depth, reps)
    return ({int(k): v for k, v in costs["verify_ratio"].items()},
            {m: s / costs["target_t1"] for m, s in seconds.items()})


def summarize(calls_per_answer: list[list[Call]], categories: list[str], verify: dict[int, float], draft: dict[int, float]) -> dict:
    """Per category and overall: predicted speedup (median over answers), tokens per call, draft tokens per call.

    verify[k] = T(k) / T(1); draft[m] = draft seconds of m model tokens / T(1).
    """
    per: dict[str, list[tuple[float, float, float]]] = {}
    for calls, category in zip(calls_per_answer, categories):
        if not calls:
            continue
        tokens = 1 + sum(c.new_tokens for c in calls)
        cost = 1 + sum(verify[c.drafted + 1] + (draft[c.model_tokens] if c.model_tokens else 0.0) for c in calls)
        row = (tokens / cost, tokens / (1 + len(calls)), sum(c.drafted for c in calls) / len(calls))
        per.setdefault(category, []).append(row)
        per.setdefault("all", []).append(row)
    out = {category: {"speedup": statistics.median(r[0] for r in rows), "tokens_per_call": statistics.mean(r[1] for r in rows),
                      "draft_tokens_per_call": statistics.mean(r[2] for r in rows), "answers": len(rows)}
           for category, rows in sorted(per.items())}
    out["all"]["mean_of_category_medians"] = statistics.mean(v["speedup"] for k, v in out.items() if k != "all")
    return out


def table(results: dict[str, dict]) -> str:
    """Markdown: one row per category, speedup and tokens per call of each setting."""
    settings = list(results)
    categories = [c for c in next(iter(results.values())) if c != "all"] + ["all"]
    lines = ["| category | answers | " + " | ".join(f"{s} speedup | τ" for s in settings) + " |",
             "|---|---|" + "---|---|" * len(settings)]
    for category in categories:
        cells = [f"{results[s][category]['speedup']:.2f}× | {results[s][category]['tokens_per_call']:.2f}" for s in settings]
        lines.append(f"| {category} | {results[settings[0]][category]['answers']} | " + " | ".join(cells) + " |")
    means = [f"{results[s]['all']['mean_of_category_medians']:.2f}× | " for s in settings]
    lines.append("| mean of the category medians | | " + " | ".join(means) + " |")
    return "\n".join(lines)


def _settings(text: str) -> list[tuple[int, float]]:
    """'2:0,5:0.6' -> [(2, 0.0), (5, 0.6)]: gamma, min_confidence pairs."""
    pairs = []
    for item in text.split(","):
        try:
            gamma, threshold = item.split(":")
            pair = (int(gamma), check_min_confidence(float(threshold)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"settings must be GAMMA:MIN_CONFIDENCE pairs such as 2:0,5:0.6, got {item!r}") from None
        if pair[0] < 1:
            raise argparse.ArgumentTypeError(f"settings: gamma must be >= 1, got {item!r}")
        pairs.append(pair)
    return pairs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", type=_settings, default=_settings("2:0,5:0.6"),
                        help="comma-separated GAMMA:MIN_CONFIDENCE pairs (default 2:0,5:0.6)")
    add_answer_options(parser)
    parser.add_argument("--draft", default="bundled", help="an EAGLE draft directory or 'bundled' (default)")
    parser.add_argument("--cost-reps", type=int, default=15, help="timed repetitions of each extend and proposal (default 15)")
    args = parser.parse_args(argv)
    data, native, features = answers_and_features(args.target, args.prompts, args.out, args.max_new_tokens)
    depth = max(gamma for gamma, _ in args.settings)
    directory = str(draft_directory(args.draft, args.target))

    verify, draft = measured_costs(args.target, directory, data, range(1, depth + 2), depth, args.cost_reps)

    network, output_ids, _ = load_eagle(directory)
    predictions = draft_predictions(network, output_ids, native.embed.weight.detach(), data, features, depth)
    results = {}
    for gamma, threshold in args.settings:
        calls = [replay(data.ids[i], data.first[i], *predictions[i], gamma, threshold, args.max_new_tokens)
                 for i in range(len(data))]
        results[f"γ={gamma} min-confidence {threshold:g}"] = summarize(calls, data.categories, verify, draft)
    report = table(results)
    ratios = ", ".join(f"T({k})/T(1) {v:.2f}" for k, v in sorted(verify.items()) if k > 1)
    drafts = ", ".join(f"{m} tokens {v:.3f}" for m, v in draft.items())
    print(f"{len(data)} greedy answers to {args.prompts}; {ratios}; draft time / T(1): {drafts}\n\n{report}")
    (args.out / "replay.json").write_text(json.dumps({"verify": verify, "draft": draft, "results": results}, indent=2) + "\n")
    (args.out / "replay.md").write_text(report + "\n")
    return results


if __name__ == "__main__":
    main()
