"""Load test of `specdecode serve`: concurrent streaming clients, checked token for token.

    .venv/bin/python scripts/load_test.py --tiny                 # starts a server on tiny random models
    .venv/bin/python scripts/load_test.py                        # starts `specdecode serve` (default model)
    .venv/bin/python scripts/load_test.py --url http://127.0.0.1:8000   # an already running server
    .venv/bin/python scripts/load_test.py --backend native --max-batch 1 32 --clients 32 64 --out load
        # the sequential server against the batched one, 32 and 64 clients each (a table, and load/results.json)

First each distinct prompt is sent once without streaming at temperature 0 (the
reference text). Then `--clients` concurrent clients stream `--requests` chat
completions of the same prompts (bounded by `--time-limit`), and every streamed text
must equal its reference: a lost, duplicated or reordered token shows as a mismatch.
Reports errors, mismatches, p50/p95 latency and time to first token, and the total
generated tokens per second. Exits 1 if any request failed or mismatched.

Only talks to 127.0.0.1 (or the --url given); all loops are bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from openai import AsyncOpenAI

from specdecode.bench.engines import machine
from specdecode.bench.load_report import OURS, load_test_table

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = [  # plain words, so the tiny word-level vocabulary covers them too
    "the quick red dog runs to the river",
    "a small bird sees the big green tree",
    "hello world , this is the blue house",
    "one two three four five six seven",
    "the cat eats a fish on the stone",
    "is it dark or light in the house ?",
    "the slow dog sleeps and the quick cat jumps",
    "what is the river , and where is it ?",
]


@dataclass
class Outcome:
    prompt: int
    latency: float = math.nan
    ttft: float = math.nan
    tokens: int = 0
    chunks: int = 0
    text: str = ""
    error: str | None = None


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    wall: float = 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); nan for no values."""
    values = sorted(v for v in values if not math.isnan(v))
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


# --------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tiny_checkpoints(directory: Path) -> tuple[Path, Path]:
    """A tiny random Llama target and a near copy as draft (the test suite's helpers)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_hf import perturbed_copy, save_tiny_checkpoint, tiny_llama, tiny_tokenizer

    target = tiny_llama(seed=20)
    tokenizer = tiny_tokenizer()
    return (
        save_tiny_checkpoint(directory / "target", target, tokenizer),
        save_tiny_checkpoint(directory / "draft", perturbed_copy(target, seed=21, scale=0.05), tokenizer),
    )


def _peer_command(port: int) -> list[str]:
    """llama-cpp-python's own OpenAI server on the default GGUF file: the peer a user would run instead."""
    from specdecode.models.loading import default_gguf_path

    return [sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path()), "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", str(os.cpu_count() or 2), "--n_ctx", "4096",
            "--interrupt_requests", "False"]  # by default a new request stops the one streaming


@contextlib.contextmanager
def started_server(args: argparse.Namespace, max_batch: int | None = None, peer: bool = False):
    """Yield the base URL of `specdecode serve` (or, with peer, llama_cpp.server) run as a child process on
    127.0.0.1; stop it with SIGINT."""
    with tempfile.TemporaryDirectory(prefix="specdecode-load-") as tmp:
        port = _free_port()
        command = [sys.executable, "-m", "specdecode.cli", "serve", "--port", str(port), "--log-level", "warning",
                   "--max-queue", str(max(64, max(args.clients))), "--max-tokens", str(max(400, args.max_tokens))]
        if args.backend:
            command += ["--backend", args.backend]
        if max_batch is not None:
            command += ["--max-batch", str(max_batch)]
        if peer:
            command = _peer_command(port)
        if args.tiny:
            target, draft = _tiny_checkpoints(Path(tmp))
            command += ["--target", str(target), "--draft", args.draft or str(draft)]
        elif args.draft:
            command += ["--draft", args.draft]
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        process = subprocess.Popen(command, cwd=ROOT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + args.start_timeout
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"the server exited with status {process.returncode}")
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not become ready in time")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                        break
                time.sleep(0.25)
            yield url
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --------------------------------------------------------------------------- the clients


async def one_request(client: AsyncOpenAI, model: str, prompt: int, args: argparse.Namespace) -> Outcome:
    outcome = Outcome(prompt)
    start = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPTS[prompt]}], max_tokens=args.max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True},
        )
        pieces = []
        async for chunk in stream:
            if chunk.usage is not None:
                outcome.tokens = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                if not pieces:
                    outcome.ttft = time.perf_counter() - start
                pieces.append(chunk.choices[0].delta.content)
        outcome.text, outcome.chunks = "".join(pieces), len(pieces)
        if not outcome.tokens:  # a server without usage in streams (llama_cpp.server): a token per chunk
            outcome.tokens = outcome.chunks
        outcome.latency = time.perf_counter() - start
    except Exception as error:  # every failure is reported, none stops the test
        outcome.error = f"{type(error).__name__}: {error}"
    return outcome


async def run_load(url: str, args: argparse.Namespace, clients: int, requests: int) -> tuple[dict[int, str], Report]:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=args.time_limit)
    model = (await client.models.list()).data[0].id
    prompts = list(range(min(args.prompts, len(PROMPTS))))
    references = {}
    for p in prompts:  # one at a time, before the load
        response = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPTS[p]}], max_tokens=args.max_tokens, temperature=0
        )
        references[p] = response.choices[0].message.content

    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        todo.put_nowait(prompts[i % len(prompts)])
    report = Report()

    async def client_loop() -> None:
        while not todo.empty():
            report.outcomes.append(await one_request(client, model, todo.get_nowait(), args))

    start = time.perf_counter()
    tasks = [asyncio.create_task(client_loop()) for _ in range(clients)]
    done, pending = await asyncio.wait(tasks, timeout=args.time_limit)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    report.wall = time.perf_counter() - start
    unfinished = requests - len(report.outcomes)
    report.outcomes += [Outcome(-1, error="not finished within --time-limit")] * unfinished
    await client.close()
    return references, report


def summarize(references: dict[int, str], report: Report, url: str) -> dict:
    ok = [o for o in report.outcomes if o.error is None]
    mismatched = [o for o in ok if o.text != references[o.prompt]]
    tokens = sum(o.tokens for o in ok)
    server: dict = {}
    health: dict = {}
    with contextlib.suppress(httpx.HTTPError, ValueError):  # a peer's server has neither: nothing of its own to add
        server = httpx.get(f"{url}/metrics.json", timeout=5).json()
        health = httpx.get(f"{url}/health", timeout=5).json()
    summary = {
        "requests": len(report.outcomes),
        "ok": len(ok),
        "errors": len(report.outcomes) - len(ok),
        "mismatches": len(mismatched),
        "first_errors": sorted({o.error for o in report.outcomes if o.error})[:3],
        "latency_p50_s": percentile([o.latency for o in ok], 50),
        "latency_p95_s": percentile([o.latency for o in ok], 95),
        "ttft_p50_s": percentile([o.ttft for o in ok], 50),
        "ttft_p95_s": percentile([o.ttft for o in ok], 95),
        "completion_tokens": tokens,
        "wall_s": report.wall,
        "tokens_per_s": tokens / report.wall if report.wall else 0.0,
        "mean_chunks_per_request": sum(o.chunks for o in ok) / len(ok) if ok else 0.0,
    }
    if server:  # the server's own view (all requests so far, references included)
        def total(name: str, key: str = "value") -> float:
            return sum(sample.get(key, 0.0) for sample in server.get(name, {}).get("samples", []))

        calls = total("specdecode_target_calls")
        rates = total("specdecode_generation_tokens_per_second", "count")
        summary["server_tokens_per_target_call"] = total("specdecode_completion_tokens") / calls if calls else None
        summary["server_mean_generation_tokens_per_s"] = (
            total("specdecode_generation_tokens_per_second", "sum") / rates if rates else None
        )
        summary["server_acceptance_by_position"] = server.get("acceptance_by_position")
    if health:  # max_batch, and the pass costs P(R) the server timed at start-up to price draft lengths
        summary["server_health"] = health
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="test a running server (http://127.0.0.1:PORT) instead of starting one")
    where.add_argument("--tiny", action="store_true", help="start a server on tiny random models (fast)")
    parser.add_argument("--draft", help="draft for the started default-model server (default: serve's default)")
    parser.add_argument("--backend", help="--backend of the started server (default: serve's default)")
    parser.add_argument("--max-batch", type=int, nargs="+", default=[None], metavar="N",
                        help="start a server with each --max-batch in turn (default: serve's default)")
    parser.add_argument("--llama-cpp-server", action="store_true",
                        help="first run the same clients against llama-cpp-python's own server on the default GGUF "
                        "(pip install sse-starlette starlette-context pydantic-settings)")
    parser.add_argument("--clients", type=int, nargs="+", default=[32], metavar="N",
                        help="concurrent streaming clients, one load phase each (default 32)")
    parser.add_argument("--requests", type=int, default=None, help="requests per phase (default: twice the clients)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--prompts", type=int, default=8, help=f"distinct prompts, at most {len(PROMPTS)} (default 8)")
    parser.add_argument("--time-limit", type=float, default=600, help="seconds for each load phase (default 600)")
    parser.add_argument("--start-timeout", type=float, default=300, help="seconds to wait for a started server")
    parser.add_argument("--out", type=Path, help="write results.json and report.md here")
    args = parser.parse_args(argv)
    if min(*args.clients, args.requests or 1, args.max_tokens, args.prompts) < 1:
        parser.error("--clients, --requests, --max-tokens and --prompts must be >= 1")
    if args.url and args.max_batch != [None]:
        parser.error("--max-batch starts servers; it does not apply to --url")

    runs = []
    servers = ([("llama_cpp.server", None)] if args.llama_cpp_server else []) + [(None, b) for b in args.max_batch]
    for peer, max_batch in servers:
        with contextlib.ExitStack() as stack:
            url = args.url.rstrip("/") if args.url else stack.enter_context(started_server(args, max_batch, bool(peer)))
            for clients in args.clients:
                requests = args.requests or 2 * clients
                references, report = asyncio.run(run_load(url, args, clients, requests))
                summary = summarize(references, report, url)
                summary.update(server=peer or OURS, backend=None if peer else args.backend,
                               max_batch=max_batch, clients=clients, references=references)
                runs.append(summary)
                print(
                    f"{peer or f'max-batch {max_batch}'}, {clients} clients: {summary['ok']}/{summary['requests']} ok, "
                    f"{summary['errors']} errors, {summary['mismatches']} mismatches; latency p50 "
                    f"{summary['latency_p50_s']:.2f}s p95 {summary['latency_p95_s']:.2f}s; TTFT p50 "
                    f"{summary['ttft_p50_s']:.2f}s p95 {summary['ttft_p95_s']:.2f}s; {summary['completion_tokens']} "
                    f"tokens in {summary['wall_s']:.1f}s = {summary['tokens_per_s']:.1f} tokens/s",
                    file=sys.stderr)
    # every server of ours decoded each prompt alone first: those references must agree across them too
    ours = [r for r in runs if r["server"] == OURS]
    alone_differs = [p for p in ours[0]["references"] if len({json.dumps(r["references"][p]) for r in ours}) > 1] if ours else []
    table = load_test_table(runs)
    print(table, end="")
    if alone_differs:
        print(f"prompts whose text decoded alone differs between servers: {alone_differs}", file=sys.stderr)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                            "machine": machine(),
                                                            "runs": runs, "alone_differs": alone_differs}, indent=1))
        (args.out / "report.md").write_text(table)
    failed = any(r["errors"] or r["mismatches"] for r in ours) or alone_differs  # a peer's own are only reported
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
