"""Alpha of EAGLE drafts on every prompt of a Spec-Bench file, per category (teacher forced on the target's answers).

    python scripts/spec_bench_alpha.py                                  # the bundled draft, ../shared/data/spec_bench_dev.jsonl
    python scripts/spec_bench_alpha.py --draft bundled --draft work/distill-eagle16/draft --out work/spec-bench-alpha

1. The target answers every prompt (first turn, chat template, greedy, up to --max-new-tokens) in batches on
   the native engine, keeping its top-k distribution at every response position and its features from the
   same passes (`distill.teacher.generate_responses`; `distill.eagle.target_features` reads them, computing
   only those of answers kept by an older specdecode).
   Both are kept in --out, so a rerun only scores.
2. Each draft is scored as `specdecode distill` scores its held-out set (`distill.train.evaluate`): alpha at
   T=0 (the draft's argmax is the target's) and a lower bound of alpha at T=1 (sum of min(p, q) over the
   target's top-k), at every response position. Every position reads the target's previous feature, which is
   what an EAGLE draft reads in decoding at gamma = 1, so these are decoding's alphas at gamma = 1 on these
   answers. The T=1 column is scored on the greedy answers too, not on sampled ones. With --depth d, every
   position is scored as the d-th token of a draft whose d - 1 tokens before it were the answer's own (the
   network reading its own g in place of the target's features, as in decoding at gamma >= d): the
   acceptance rate at draft position d given that the ones before were accepted.

The weights are float32 (decoding drafts on int8 where the kernel runs: alpha within 0.006, docs/distill.md).
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from specdecode.bench.prompts import load_prompts
from specdecode.distill.alpha_table import alpha_table
from specdecode.distill.eagle import EagleObjective, target_features
from specdecode.distill.sources import TrainingPrompt
from specdecode.distill.teacher import generate_responses, load_teacher, native_teacher
from specdecode.distill.train import evaluate
from specdecode.drafters.distilled import bundled_draft_dir
from specdecode.drafters.eagle import load_eagle
from specdecode.models.loading import DEFAULT_TARGET, load_model
from specdecode.native.loading import native_from_hf_model

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench_dev.jsonl"


def draft_directory(name: str, target: str) -> Path:
    """`bundled` (the target's bundled draft) or a draft directory."""
    if name == "bundled":
        directory = bundled_draft_dir(target)
        if directory is None:
            raise ValueError(f"--draft bundled: {target} has no bundled draft")
        return directory
    return Path(name)


def score(directory: Path, data, features: list[torch.Tensor], embedding: torch.Tensor, batch_tokens: int,
          depth: int = 1) -> dict:
    """evaluate() of the EAGLE draft in directory on data at draft depth `depth`:
    {category: alpha_greedy, alpha_t1, coverage, positions}."""
    network, output_ids, _ = load_eagle(directory)
    output_index = torch.full((embedding.shape[0],), -1, dtype=torch.long)
    output_index[output_ids] = torch.arange(output_ids.numel())
    objective = EagleObjective(network, embedding, features)
    return evaluate(network, data, output_index, batch_tokens, partial(objective.scored_logits, depth=depth))


def answers_and_features(target_name: str, prompts_file: Path, out: Path, max_new_tokens: int,
                         batch_size: int | None = None):
    """The target's greedy answers to the first turns of prompts_file with their top-k distributions, the native
    target (float32) and its features f [L_i - 1, H] of every answer; kept in `out`, so a rerun reads them back.

    batch_size (prompts per generate call; the shards are laid out by it): None takes what `out`'s answers were
    made with (48 for new ones), so the replay scripts reuse answers made with any.
    """
    out.mkdir(parents=True, exist_ok=True)
    settings = {"target": target_name, "prompts": str(prompts_file.resolve()), "max_new_tokens": max_new_tokens}
    settings_file = out / "settings.json"
    recorded = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    made_with = recorded.pop("batch_size", 48) if recorded else None  # files without it were made at 48
    if recorded and recorded != settings:
        raise SystemExit(f"{out} holds answers made with other settings ({json.dumps(recorded)}); use another --out")
    if batch_size is None:
        batch_size = made_with or 48
    elif made_with is not None and batch_size != made_with:
        raise SystemExit(f"{out} holds answers made with --batch-size {made_with}; use that, or another --out")
    settings_file.write_text(json.dumps({**settings, "batch_size": batch_size}) + "\n")
    loaded = load_model(target_name)
    prompts = [TrainingPrompt(p.category, p.text) for p in load_prompts(prompts_file)]
    generate_responses(loaded.hf_model, loaded.tokenizer, prompts, out, max_new_tokens=max_new_tokens,
                       batch_size=batch_size, top_k=32, sample_fraction=0.0, seed=0, max_prompt_tokens=1 << 20,
                       native=native_teacher(loaded.hf_model), features=True)
    data = load_teacher(out)
    target = native_from_hf_model(loaded.hf_model, torch.float32)
    return data, target, target_features(target, data, out)


def add_answer_options(parser: argparse.ArgumentParser) -> None:
    """--target, --prompts, --out, --max-new-tokens: what answers_and_features takes."""
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="Spec-Bench JSONL (first turn of each)")
    parser.add_argument("--out", type=Path, default=Path("work/spec-bench-alpha"), help="keeps the answers and features")
    parser.add_argument("--max-new-tokens", type=int, default=128)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_answer_options(parser)
    parser.add_argument("--draft", action="append", help="an EAGLE draft directory or 'bundled' (repeatable; default bundled)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="prompts per generate call (default 48, or what --out's answers were made with)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="tokens per scoring batch")
    parser.add_argument("--depth", type=int, default=1,
                        help="score the d-th draft token, the d - 1 before it being the answer's own (default 1)")
    args = parser.parse_args(argv)
    if args.depth < 1:
        parser.error(f"--depth must be >= 1, got {args.depth}")
    drafts = {name: draft_directory(name, args.target) for name in args.draft or ["bundled"]}
    data, target, features = answers_and_features(args.target, args.prompts, args.out, args.max_new_tokens, args.batch_size)
    embedding = target.embed.weight.detach()
    results = {name: score(directory, data, features, embedding, args.batch_tokens, args.depth)
               for name, directory in drafts.items()}
    report = alpha_table(results)
    print(f"{len(data)} answers to {args.prompts}, {data.num_positions()} positions, draft depth {args.depth}\n\n{report}")
    stem = "alpha" if args.depth == 1 else f"alpha-depth{args.depth}"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(report + "\n")
    return results


if __name__ == "__main__":
    main()
