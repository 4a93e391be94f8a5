"""`specdecode distill`: the command-line face of `specdecode.distill.recipe.distill`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import fields
from pathlib import Path

from specdecode.distill.data import DataConfig
from specdecode.distill.recipe import DraftArchitecture, distill
from specdecode.distill.train import TrainConfig
from specdecode.drafters.distilled import bundled_draft_dir
from specdecode.models.loading import DEFAULT_TARGET

__all__ = ["add_parser", "run"]

_DEFAULTS = {**{f.name: f.default for f in fields(DataConfig)}, **{f.name: f.default for f in fields(DraftArchitecture)},
             **{f.name: f.default for f in fields(TrainConfig)}}


_SHAPE = ("layers", "hidden", "heads", "kv_heads", "intermediate")


def _layer_list(text: str) -> tuple[int, ...]:
    """'0,1,2' -> (0, 1, 2)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices like 0,1,2, got {text!r}") from None


def _continue_from(value: str | None, target: str, eagle: bool) -> Path | None:
    """--continue-from's directory: 'bundled' is the target's bundled draft."""
    if value is None:
        return None
    if not eagle:
        raise ValueError("--continue-from trains an EAGLE draft further; add --eagle")
    if value != "bundled":
        return Path(value)
    bundled = bundled_draft_dir(target)
    if bundled is None:
        raise ValueError(f"--continue-from bundled: specdecode ships no draft for {target}")
    return bundled


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "distill",
        help="train a small draft model for a target by distillation (resumable; see docs/distill.md)",
        description="Build the target's data (responses to built-in prompts, natural text), train a draft to match "
        "its distributions, and save it to OUT/draft with a model card. Rerun the same command to resume.",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help=f"target model (default {DEFAULT_TARGET})")
    parser.add_argument("--out", type=Path, required=True, help="work directory: data, checkpoints, and the draft in OUT/draft")
    data = parser.add_argument_group("data")
    data.add_argument("--prompts-per-category", type=int, default=_DEFAULTS["prompts_per_category"])
    data.add_argument("--prompt-file", help="JSONL prompts ('prompt' or 'turns', optional 'category') instead of the built-in ones")
    data.add_argument("--german-file", help="German text for German-to-English translation prompts: a fortune file "
                      "('%%' lines between entries, e.g. Debian's fortunes-de zitate.u8) or entries separated by blank lines")
    data.add_argument("--german-prompts", type=int, default=_DEFAULTS["german_prompts"],
                      help="how many translation prompts to draw from --german-file (added after the others)")
    data.add_argument("--max-new-tokens", type=int, default=_DEFAULTS["max_new_tokens"], help="length of the target's responses")
    data.add_argument("--sample-fraction", type=float, default=_DEFAULTS["sample_fraction"], help="share of response batches sampled at T=1 (the rest greedy)")
    data.add_argument("--text-documents", type=int, default=_DEFAULTS["text_documents"], help="natural-text documents (XSum)")
    data.add_argument("--text-file", help="extra natural text: .jsonl with 'text', or paragraphs separated by blank lines")
    data.add_argument("--top-k", type=int, default=_DEFAULTS["top_k"], help="target log-probabilities kept per position")
    data.add_argument("--data-batch-size", type=int, default=_DEFAULTS["batch_size"], help="prompts per batched generate call")
    arch = parser.add_argument_group("draft architecture")
    for name in _SHAPE:  # None = the default; with --target-layers the shape is the target's
        arch.add_argument("--" + name.replace("_", "-"), type=int, help=f"default {_DEFAULTS[name]}")
    arch.add_argument("--target-layers", type=_layer_list, default=(),
                      help="cut the draft from these target layers, e.g. 0,1,2: the target's shape, embeddings "
                      "(frozen, stored in int8), final norm and head rows, then distilled (instead of --layers ...)")
    arch.add_argument("--eagle", action="store_true",
                      help="an EAGLE draft: one decoder layer of the target's shape that reads the target's own features "
                      "(its final-norm outputs) and shares its embeddings and head rows; runs on the native engine only")
    arch.add_argument("--output-vocab", type=int, default=_DEFAULTS["output_vocab"],
                      help="head over the N most likely target tokens (q = 0 elsewhere); 0 = whole vocabulary")
    arch.add_argument("--continue-from", metavar="DIR",
                      help="with --eagle: train this EAGLE draft further (a draft directory, or 'bundled' for the "
                      "target's bundled draft) instead of a fresh network; it keeps that draft's head")
    arch.add_argument("--init-from-target", action=argparse.BooleanOptionalAction, default=_DEFAULTS["init_from_target"],
                      help="initialise embeddings from a PCA of the target's (default on)")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=_DEFAULTS["epochs"])
    train.add_argument("--batch-tokens", type=int, default=_DEFAULTS["batch_tokens"])
    train.add_argument("--lr", type=float, default=_DEFAULTS["lr"])
    train.add_argument("--depth", type=int, default=_DEFAULTS["depth"],
                       help="EAGLE drafts: train the first DEPTH draft tokens, each deeper one reading the network's own "
                       "previous output as in decoding (default 1: the first only)")
    train.add_argument("--deep-epochs", type=int, help="with --depth: only the last N epochs train the deeper tokens, "
                       "the others the first token alone (a depth-1 step costs about a third of a depth-2 one; default: every epoch)")
    train.add_argument("--tv-weight", type=float, default=_DEFAULTS["tv_weight"],
                       help="add this multiple of the total variation between the target's and the draft's distributions "
                       "(what alpha at temperature 1 measures) to the forward-KL loss (default 0)")
    train.add_argument("--feature-weight", type=float, default=_DEFAULTS["feature_weight"],
                       help="EAGLE drafts: weight of the smooth-L1 loss of the predicted feature against the target's (default 1)")
    train.add_argument("--checkpoint-every", type=int, default=_DEFAULTS["checkpoint_every"], help="steps between checkpoints")
    train.add_argument("--held-out", type=float, default=0.08, help="share of sequences held out for the alpha report")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        data = DataConfig(
            prompts_per_category=args.prompts_per_category, prompt_file=args.prompt_file,
            german_file=args.german_file, german_prompts=args.german_prompts, max_new_tokens=args.max_new_tokens,
            sample_fraction=args.sample_fraction, text_documents=args.text_documents, text_file=args.text_file,
            top_k=args.top_k, batch_size=args.data_batch_size, seed=args.seed,
        )
        shape = {name: getattr(args, name) for name in _SHAPE if getattr(args, name) is not None}
        kind = "--target-layers" if args.target_layers else "--eagle" if args.eagle else None
        if kind and shape:
            raise ValueError(f"{kind} takes the target's shape; drop {', '.join('--' + n.replace('_', '-') for n in shape)}")
        if args.eagle and args.target_layers:
            raise ValueError("--eagle and --target-layers are two kinds of draft; choose one")
        architecture = DraftArchitecture(
            **shape, output_vocab=args.output_vocab, init_from_target=args.init_from_target,
            target_layers=args.target_layers, eagle=args.eagle,
        )
        training = TrainConfig(epochs=args.epochs, batch_tokens=args.batch_tokens, lr=args.lr,
                               checkpoint_every=args.checkpoint_every, seed=args.seed, depth=args.depth,
                               deep_epochs=args.deep_epochs, tv_weight=args.tv_weight,
                               feature_weight=args.feature_weight)
        if args.depth > 1 and not args.eagle:
            raise ValueError(f"--depth {args.depth} trains an EAGLE draft's deeper tokens; add --eagle")
        if args.feature_weight != _DEFAULTS["feature_weight"] and not args.eagle:
            raise ValueError("--feature-weight weighs an EAGLE draft's feature loss; add --eagle")
        continue_from = _continue_from(args.continue_from, args.target, args.eagle)
    except ValueError as error:
        parser.error(str(error))  # exits with status 2
    try:
        command = "specdecode " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["distill"] else None
        report = distill(args.target, args.out, data, architecture, training, held_out=args.held_out, command=command,
                         continue_from=continue_from)
    except (ValueError, FileNotFoundError) as error:
        print(f"specdecode: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report["held_out"]["all"]))
    print(f"draft saved to {args.out / 'draft'}; use it with: specdecode generate --draft {args.out / 'draft'} ...")
    return 0
