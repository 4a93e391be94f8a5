"""Time the native engine's batched generation (distillation's responses) of this checkout against another's.

    git worktree add /tmp/old HEAD~1
    python scripts/batch_generate_ab.py --other /tmp/old --batches 1 5 9

Each chosen batch of the built-in prompts (`--prompts-per-category`, the chat template, cut to their last 256
tokens, batched as `specdecode distill` batches them) is answered greedily by the default target, old, new,
new, old in one process, with its top-k distributions and features as `make distill` keeps them. Prints each
run's seconds, whether the tokens and features agree, and the ratio of the summed times. The two checkouts'
`native/batch_generate.py` are what differ; everything else (the target, its packing) is this checkout's.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

from specdecode.distill.sources import builtin_prompts
from specdecode.distill.teacher import chat_ids, native_teacher, response_batches
from specdecode.models.loading import load_model
from specdecode.native import batch_generate
from specdecode.native.loading import end_of_sequence_ids


def _other_module(checkout: Path):
    """The other checkout's specdecode.native.batch_generate, loaded under its own name."""
    path = checkout / "src" / "specdecode" / "native" / "batch_generate.py"
    if not path.is_file():
        raise SystemExit(f"--other: no {path}")
    spec = importlib.util.spec_from_file_location("other_batch_generate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="the other checkout (a git worktree), run as 'old'")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 5, 9], help="which batches of the prompts")
    parser.add_argument("--prompts-per-category", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = {"old": _other_module(args.other), "new": batch_generate}
    loaded = load_model()
    native = native_teacher(loaded.hf_model)
    eos = end_of_sequence_ids(loaded.hf_model, loaded.tokenizer)
    encoded = [chat_ids(loaded.tokenizer, p.text)[-256:] for p in builtin_prompts(args.prompts_per_category, 0)]
    batches = response_batches([len(ids) for ids in encoded], 48)
    if max(args.batches) >= len(batches):
        raise SystemExit(f"--batches: there are {len(batches)} batches (0 .. {len(batches) - 1})")
    totals = {"old": 0.0, "new": 0.0}
    for which in args.batches:
        prompts = [encoded[i] for i in batches[which]]
        made = {}
        for name in ("old", "new", "new", "old"):
            started = time.perf_counter()
            made[name] = engines[name].generate_batch(native, prompts, args.max_new_tokens, eos=eos, top_k=32,
                                                      features=True)
            seconds = time.perf_counter() - started
            totals[name] += seconds
            print(f"batch {which} ({min(map(len, prompts))}-{max(map(len, prompts))} prompt tokens): {name} {seconds:.1f} s",
                  flush=True)
        same = sum(a == b for a, b in zip(made["old"].tokens, made["new"].tokens))
        features = sum(torch.equal(a, b) for a, b in zip(made["old"].features, made["new"].features))
        print(f"  the same tokens in {same} of {len(prompts)} answers, the same features in {features}")
    print(f"old {totals['old']:.1f} s, new {totals['new']:.1f} s: new is {totals['old'] / totals['new']:.3f}x as fast")


if __name__ == "__main__":
    main()
