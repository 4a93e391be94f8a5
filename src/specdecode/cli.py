"""The `specdecode` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from specdecode.backends import BACKENDS, DTYPES, PACKINGS
from specdecode.bench import cli as bench_cli
from specdecode.core.sampling import SamplingParams
from specdecode.distill import cli as distill_cli
from specdecode.decoding import GenerationResult, GenerationStats
from specdecode.models.loading import DEFAULT_TARGET
from specdecode.drafters.base import check_min_confidence
from specdecode.questions import read_questions
from specdecode.pairs import DEFAULT_MIN_CONFIDENCE
from specdecode.pipeline import DEFAULT_DRAFT, DEFAULT_GAMMA, Pipeline, engine_name, incremental_text
from specdecode.drafters.per_sequence import runs_per_sequence
from specdecode.native.batching import DEFAULT_MAX_BATCH

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdecode", description="Exact speculative decoding for Hugging Face models.")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate text from a prompt with speculative decoding")
    gen.add_argument("prompt", nargs="?", help="the prompt (or use --prompt-file)")
    gen.add_argument("--prompt-file", type=Path, help="Spec-Bench-style JSONL: the first turn of each line is a prompt")
    gen.add_argument("--limit", type=int, help="with --prompt-file: use only the first N prompts")
    add_model_options(gen)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None, help="apply the chat template (default: when the tokenizer has one)")
    gen.add_argument("--compare", action="store_true", help="also run the target alone; report speedup and whether greedy outputs match")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of streaming text")

    distill_cli.add_parser(commands)

    serve = commands.add_parser("serve", help="serve an OpenAI-compatible HTTP API (completions, chat, streaming, metrics)")
    add_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument("--model-name", help="the served model's id in the API (default: --target)")
    serve.add_argument("--max-prompt-tokens", type=int, default=2048, help="longest prompt in tokens (default 2048)")
    serve.add_argument("--max-tokens", type=int, default=400, help="largest max_tokens a request may ask for (default 400); "
                       "a completion without max_tokens gets 16, or this if lower")
    serve.add_argument("--max-queue", type=int, default=64, help="requests that may wait while --max-batch run; more get 429 (default 64)")
    serve.add_argument("--max-batch", type=int, default=None,
                       help=f"requests decoded together in batched forward passes, each with its own draft "
                       f"(continuous batching; native engine only; default {DEFAULT_MAX_BATCH} on the native engine unless the draft "
                       "is a separate model, else 1)")
    serve.add_argument("--shutdown-grace", type=float, default=30.0, help="seconds a running generation may finish at shutdown (default 30)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    bench_cli.add_parsers(commands)
    return parser


def _positive_integer(name: str):
    """An argparse type: an integer >= 1, else an error naming the option."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be an integer >= 1, got {text!r}")
        return value

    return parse


_gamma = _positive_integer("gamma")  # --gamma
_threads = _positive_integer("threads")  # --threads


def _min_confidence(text: str) -> float:
    """argparse type of --min-confidence: a number in [0, 1]."""
    try:
        return check_min_confidence(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"min-confidence must be a number in [0, 1], got {text!r}") from None


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model options a subcommand shares: --target, --draft, --gamma, --min-confidence, --backend, --packing."""
    parser.add_argument("--target", default=DEFAULT_TARGET, help=f"target model: {DEFAULT_TARGET} (default), another known model (qwen2.5-coder-1.5b-instruct, qwen2.5-coder-0.5b-instruct), a .gguf file or an HF directory/id")
    parser.add_argument("--draft", default=DEFAULT_DRAFT, help="draft: 'auto' (default: the target's draft in specdecode.pairs for its engine, with cost-aware draft lengths; prompt lookup for a target without one), 'ngram' (prompt lookup), 'bundled', 'bundled+ngram', 'none' (target alone), or a known model's name or a model path/id (add '+ngram' to prefer prompt lookup on repeats)")
    parser.add_argument("--gamma", type=_gamma, default=None, help=f"the most draft tokens per target call (default: the target's pair entry with --draft auto, 5 for the known models; else {DEFAULT_GAMMA})")
    parser.add_argument("--min-confidence", type=_min_confidence, default=None,
                        help="a draft model (the bundled EAGLE draft, a draft path) ends its draft before gamma tokens after a "
                             f"token it gave a probability below this (default: the target's pair entry with --draft auto, else {DEFAULT_MIN_CONFIDENCE}; 0 always drafts gamma)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="engine: llamacpp (llama.cpp, GGUF files), native (fast PyTorch Llama/Qwen2/Mistral), hf (transformers), auto (default: a GGUF file on whichever of llamacpp and native decodes it faster here, timed once and cached; other models native where supported)")
    parser.add_argument("--draft-backend", choices=BACKENDS, default=None, help="engine of a draft model (default: --backend's); e.g. llamacpp runs a GGUF draft's quantized weights beside a native target")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="weights of the native engine and transformers (target and draft): float32 (default) or bfloat16 (half the memory; on a CPU with AVX-512 BF16 or AMX also faster); llama.cpp runs the GGUF file's own")
    parser.add_argument("--threads", type=_threads, default=None, help="llama.cpp's threads (default: every core this process may use)")
    parser.add_argument("--packing", choices=PACKINGS, default="auto", help="native engine's layout of the target's linear layers: auto (default: with a draft, whichever of dual and none verifies gamma+1 tokens (at most 3 with a draft model that ends early, as --draft auto's does) faster here, timed once per machine and cached; without one dual, the fastest single token), none (plain weights), packed (oneDNN), dual (both)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(parser, args)
    if args.command in bench_cli.COMMANDS:
        return bench_cli.run(parser, args, argv)
    if args.command == "distill":
        return distill_cli.run(args, parser)
    try:
        prompts = _prompts(args)
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        if args.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {args.max_new_tokens}")
    except ValueError as error:
        parser.error(str(error))  # exits with status 2
    try:
        pipeline = Pipeline.load(args.target, args.draft, args.gamma, args.backend, args.packing,
                                 min_confidence=args.min_confidence, threads=args.threads, dtype=args.dtype,
                                 draft_backend=args.draft_backend)
        _warm_up(pipeline)
        progress = _progress(prompts, enabled=args.prompt_file is not None and sys.stderr.isatty())
        for extra, prompt in progress:
            _run_one(pipeline, prompt, extra, sampling, args)
    except (ValueError, FileNotFoundError, ImportError) as error:  # bad model paths, incompatible pairs, prompts too long, no llama.cpp binding
        print(f"specdecode: error: {error}", file=sys.stderr)
        return 2
    return 0


def _prompts(args) -> list[tuple[dict, str]]:
    if (args.prompt is None) == (args.prompt_file is None):
        raise ValueError("give either a prompt or --prompt-file")
    if args.prompt is not None:
        if not args.prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        return [({}, args.prompt)]
    try:
        questions = read_questions(args.prompt_file)
    except ValueError as error:
        raise ValueError(f"prompt-file: {error}") from error
    prompts = [({k: record[k] for k in ("question_id", "category") if k in record}, turn) for _, record, turn in questions]
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"limit must be >= 1, got {args.limit}")
        prompts = prompts[: args.limit]
    return prompts


def _progress(prompts, enabled: bool) -> Iterator:
    if not enabled:
        return iter(prompts)
    from tqdm import tqdm

    return iter(tqdm(prompts, desc="prompts", unit="prompt"))


def _warm_up(pipeline: Pipeline) -> None:
    """One short run so first-call costs (allocations, lazy init) land in neither timing."""
    ids = pipeline.encode("Hello", chat=False)
    pipeline.generate(ids, max_new_tokens=2, sampling=SamplingParams(0.0))


def _run_one(pipeline: Pipeline, prompt: str, extra: dict, sampling: SamplingParams, args) -> None:
    prompt_ids = pipeline.encode(prompt, args.chat)
    options = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, stop=args.stop, seed=args.seed)
    tokens = pipeline.stream(prompt_ids, **options)
    if args.json:
        result = tokens.run()
    else:
        for piece in incremental_text(pipeline, iter(tokens), args.stop):
            print(piece, end="", flush=True)
        print()
        result = tokens.result
    baseline = pipeline.generate(prompt_ids, speculative=False, **options) if args.compare else None

    if args.json:
        print(json.dumps(_record(pipeline, result, baseline, sampling, args.stop, extra)), flush=True)
    else:
        print(_summary(result, baseline, sampling, pipeline), file=sys.stderr, flush=True)


def _record(pipeline, result: GenerationResult, baseline: GenerationResult | None, sampling, stop, extra: dict) -> dict:
    stats = result.stats
    record = {
        **extra,
        "text": pipeline.text(result.token_ids, stop),
        "token_ids": result.token_ids,
        "finish_reason": result.finish_reason,
        "draft": pipeline.drafter.name if pipeline.drafter else None,
        "stats": stats.to_dict(),
    }
    if baseline is not None:
        record["baseline"] = {
            "token_ids": baseline.token_ids,
            "tokens_per_s": baseline.stats.tokens_per_s,
            "decode_tokens_per_s": baseline.stats.decode_tokens_per_s,
            "seconds": baseline.stats.seconds,
        }
        record["identical"] = baseline.token_ids == result.token_ids if sampling.greedy else None
        record["speedup"] = _speedup(result, baseline)
        record["decode_speedup"] = _speedup(result, baseline, after_first_token=True)
    return record


def _speedup(result: GenerationResult, baseline: GenerationResult, after_first_token: bool = False) -> float | None:
    """tokens/s over the baseline's; with after_first_token, the decoding rates without the prefills."""
    rates = [r.stats.decode_tokens_per_s if after_first_token else r.stats.tokens_per_s for r in (result, baseline)]
    if after_first_token and min(rates) <= 0:  # a single token: nothing was decoded after the first
        return None
    return rates[0] / rates[1] if rates[1] > 0 else None


def _rates(s: GenerationStats) -> str:
    """'12 tokens in 0.50s (24.0 tok/s; first token after 0.10s, then 27.5 tok/s)'"""
    return (f"{s.new_tokens} tokens in {s.seconds:.2f}s ({s.tokens_per_s:.1f} tok/s; "
            f"first token after {s.first_token_seconds:.2f}s, then {s.decode_tokens_per_s:.1f} tok/s)")


def _summary(result: GenerationResult, baseline: GenerationResult | None, sampling, pipeline) -> str:
    s = result.stats
    alpha = "n/a" if s.alpha is None else f"{s.alpha:.2f}"
    draft = pipeline.drafter.name if pipeline.drafter else "none"
    gamma = f"gamma<={pipeline.gamma} by cost" if pipeline.costs is not None else f"gamma={pipeline.gamma}"
    engine = type(pipeline.target.model).__name__
    line = (
        f"[{draft} {gamma}] {_rates(s)}, "
        f"{s.target_calls} target calls, {s.mean_accepted:.2f} tokens/call, alpha {alpha}, "
        f"time target {s.target_seconds:.2f}s / draft {s.draft_seconds:.2f}s / other {s.overhead_seconds:.2f}s, "
        f"finish: {result.finish_reason}, engine {engine}"
    )
    if pipeline.costs is not None:
        lengths = ", ".join(f"{g}: {n}" for g, n in sorted(s.draft_lengths.items()))
        line += f"\n  draft tokens per call -> calls: {lengths}"
    if baseline is not None:
        speedup, after_first = _speedup(result, baseline), _speedup(result, baseline, after_first_token=True)
        line += f"\n[target alone] {_rates(baseline.stats)}"
        line += f"; speedup {speedup:.2f}x" if speedup else ""
        line += f" ({after_first:.2f}x after the first token)" if after_first else ""
        if sampling.greedy:
            same = baseline.token_ids == result.token_ids
            line += "; greedy outputs identical" if same else "; GREEDY OUTPUTS DIFFER (this is a bug, please report it)"
    return line


def _serve(parser: argparse.ArgumentParser, args) -> int:
    """`specdecode serve`: load the pipeline, warm it up, serve until interrupted."""
    from specdecode.server import ServerConfig, serve  # fastapi and uvicorn only when serving

    try:
        if not 0 <= args.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {args.port}")
        config = ServerConfig(
            model_id=args.model_name,
            max_prompt_tokens=args.max_prompt_tokens,
            max_tokens=args.max_tokens,
            max_queue=args.max_queue,
            max_batch=1 if args.max_batch is None else args.max_batch,
            shutdown_grace=args.shutdown_grace,
            draft_aliases=(args.draft,),
        )
    except ValueError as error:
        parser.error(str(error))  # exits with status 2
    try:
        pipeline = Pipeline.load(args.target, args.draft, args.gamma, args.backend, args.packing,
                                 min_confidence=args.min_confidence, threads=args.threads, dtype=args.dtype,
                                 draft_backend=args.draft_backend)
        _warm_up(pipeline)
        if args.max_batch is None:  # batching where the engine and the draft allow it
            batches = engine_name(pipeline.target.model) == "native" and runs_per_sequence(pipeline.drafter)
            config = dataclasses.replace(config, max_batch=DEFAULT_MAX_BATCH if batches else 1)
        serve(pipeline, config, host=args.host, port=args.port, log_level=args.log_level)
    except (ValueError, FileNotFoundError, ImportError) as error:
        print(f"specdecode: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
