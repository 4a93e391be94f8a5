"""An EAGLE draft on float32 against int8 weights: the cost of a draft step, and alpha and speed in decoding.

    python scripts/eagle_int8.py                      # the bundled draft on the default target
    python scripts/eagle_int8.py --draft DIR --target PATH --prompts FILE.jsonl --max-new-tokens 96

1. Step cost: the median time of one draft step (1 and 2 positions, as after a rejection and after an
   acceptance at gamma = 1) over the target's one-token extend, interleaved.
2. Decoding: one prompt per category of a Spec-Bench JSONL file (first turn, chat template), at
   temperature 0 and 1, gamma 1, runs interleaved with the target alone: alpha, speedup of the pooled
   tokens/s, and the draft's seconds per call over the target's seconds per call alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.distill.teacher import chat_ids
from specdecode.drafters.distilled import bundled_draft_dir
from specdecode.drafters.eagle import EagleDrafter, load_eagle
from specdecode.models.loading import DEFAULT_TARGET
from specdecode.native import load_native

KINDS = ("none", "int8")


@torch.inference_mode()
def step_costs(target, drafters: dict[str, EagleDrafter], reps: int) -> dict[str, float]:
    """Median ms of the target's 1-token extend and of each drafter's network step over 1 and 2 positions."""
    context = torch.arange(10, 10 + min(300, target.max_length // 2)) % target.vocab_size
    target.prefill(context)
    hidden = target.config.hidden_size
    caches = {kind: d.network.new_cache(len(context) + 8) for kind, d in drafters.items()}
    times: dict[str, list[float]] = {"target": []} | {f"{kind} x{rows}": [] for kind in drafters for rows in (1, 2)}
    for rep in range(reps + 3):
        for key in times:
            start = time.perf_counter()
            if key == "target":
                target.extend(context[:1])
                target.rollback(0)
            else:
                kind, rows = key.split(" x")
                network = drafters[kind].network
                g = network.step(torch.randn(int(rows), hidden), target.model.embed(context[: int(rows)]),
                                 len(context), caches[kind])
                network.head(g[-1:])
            if rep >= 3:  # the first passes warm up
                times[key].append(time.perf_counter() - start)
    return {key: 1000 * statistics.median(values) for key, values in times.items()}


def decoding(target, tokenizer, drafters: dict[str, EagleDrafter], prompts: list[list[int]], max_new_tokens: int,
             eos: set[int]) -> dict:
    """{temperature: {kind: alpha, speedup, c_run}} over the prompts, runs interleaved with the target alone."""
    out = {}
    for temperature in (0.0, 1.0):
        pooled = {kind: {"tokens": 0, "seconds": 0.0, "accepted": 0, "evaluated": 0, "draft_s": 0.0, "draft_calls": 0,
                         "target_s": 0.0, "target_calls": 0} for kind in ("alone", *drafters)}
        for i, ids in enumerate(prompts):
            for kind in ("alone", *drafters, "alone"):
                result = generate(target, ids, drafter=drafters.get(kind), gamma=1, max_new_tokens=max_new_tokens,
                                  sampling=SamplingParams(temperature), eos_token_ids=eos,
                                  generator=torch.Generator().manual_seed(i))
                s, p = result.stats, pooled[kind]
                p["tokens"] += s.new_tokens
                p["seconds"] += s.seconds
                p["accepted"] += s.accepted_tokens
                p["evaluated"] += s.accepted_tokens + s.rejections
                p["draft_s"] += s.draft_seconds
                p["draft_calls"] += s.draft_calls
                p["target_s"] += s.target_seconds
                p["target_calls"] += s.target_calls
        alone = pooled["alone"]
        step = alone["target_s"] / alone["target_calls"]
        out[temperature] = {
            kind: {"alpha": round(p["accepted"] / max(1, p["evaluated"]), 3),
                   "speedup": round(p["tokens"] / p["seconds"] / (alone["tokens"] / alone["seconds"]), 3),
                   "c_run": round(p["draft_s"] / max(1, p["draft_calls"]) / step, 3)}
            for kind, p in pooled.items() if kind != "alone"
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", help="an EAGLE draft directory (default: the target's bundled draft)")
    parser.add_argument("--prompts", default="../shared/data/spec_bench_dev.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions of each step")
    args = parser.parse_args(argv)
    loaded = load_native(args.target)
    draft = args.draft or bundled_draft_dir(args.target)
    if draft is None:
        parser.error(f"--draft: {args.target} has no bundled draft")
    drafters = {}
    for kind in KINDS:
        network, output_ids, _ = load_eagle(draft)
        drafters[kind] = EagleDrafter(network, output_ids, loaded.model, quantize=kind)
    costs = step_costs(loaded.model, drafters, args.reps)
    print("step ms:", json.dumps({k: round(v, 2) for k, v in costs.items()}))
    print("c (one position):", json.dumps({kind: round(costs[f"{kind} x1"] / costs["target"], 3) for kind in KINDS}))
    rows = [json.loads(line) for line in open(args.prompts)]
    first_of_category = {}
    for row in rows:
        first_of_category.setdefault(row.get("category"), row["turns"][0])
    prompts = [chat_ids(loaded.tokenizer, text) for text in first_of_category.values()]
    eos = {loaded.tokenizer.eos_token_id} if loaded.tokenizer.eos_token_id is not None else set()
    result = decoding(loaded.model, loaded.tokenizer, drafters, prompts, args.max_new_tokens, eos)
    for temperature, kinds in result.items():
        print(f"T={temperature:g}, gamma 1, {len(prompts)} prompts:", json.dumps(kinds))
    return {"step_ms": costs, "decoding": result}


if __name__ == "__main__":
    main()
