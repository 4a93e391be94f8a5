"""`specdecode bench-engines`: every engine, and what a user would run instead, on the same prompts in one run.

Methods (each prompt x temperature runs every method once, in an order that rotates per prompt):
- `llama.cpp`: llama-cpp-python's own generation loop (`Llama.generate`) on the same token ids: the peer;
- `llama.cpp prompt lookup`: the binding's own speculative mode (`LlamaPromptLookupDecoding`);
- `HF generate`: transformers' `generate` on the same GGUF file (dequantized to float32);
- ours on each engine (`llamacpp`, `native`): the target alone, and `--draft auto` (cost-aware draft lengths).
Each run's rate is new tokens over wall seconds, prefill included. A method's speedup is the median over
prompts of its rate over the same engine's target alone on that prompt. At T = 0 each of our speculative
outputs is compared with the same engine's target alone, at the first differing token, on the logits each
run chose its token from (recorded in a second, untimed run): a near tie when they differ by no more than
twice the engine's kernel noise (`kernel_noise`: llama.cpp's kernels for several tokens round differently
from its one-token kernels once the context passes about 256 tokens), a MISMATCH otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.bench.prompts import BenchPrompt, load_prompts, spread_subset
from specdecode.core.sampling import SamplingParams
from specdecode.models.loading import DEFAULT_TARGET
from specdecode.pipeline import Pipeline

__all__ = ["METHODS", "run_engines_bench", "headline_table", "main"]
_CONTEXT = 2048  # llama.cpp's context in this bench: prompts longer than this less the new tokens are skipped

# name -> (engine, kind): kind "ours" / "ours-auto" (our loop), "peer" (another library's loop)
METHODS = {
    "llama.cpp": ("llamacpp", "peer"),
    "llama.cpp prompt lookup": ("llamacpp", "peer"),
    "HF generate": ("hf", "peer"),
    "ours llamacpp target alone": ("llamacpp", "ours"),
    "ours llamacpp --draft auto": ("llamacpp", "ours-auto"),
    "ours native target alone": ("native", "ours"),
    "ours native --draft auto": ("native", "ours-auto"),
}
_BASELINE = {"llamacpp": "llama.cpp", "hf": "HF generate", "native": "ours native target alone"}
_OURS_ALONE = {"llamacpp": "ours llamacpp target alone", "native": "ours native target alone"}


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    draft_lengths: dict[int, int] | None = None
    logits: dict[int, torch.Tensor] | None = None  # at T=0: generated index -> the logits [V] it was chosen from

    @property
    def rate(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


class _LogitRecorder:
    """Wraps a target: keeps, for each generated index, the last logits computed for it (those that decided it:
    a rejected call's rows are recomputed by the next call)."""

    def __init__(self, model) -> None:
        self.model = model
        self.rows: dict[int, torch.Tensor] = {}

    def __getattr__(self, name):  # the rest of the LanguageModel protocol, and the engine's extras
        return getattr(self.model, name)

    def prefill(self, prompt_ids):
        logits = self.model.prefill(prompt_ids)
        self.rows = {0: logits.clone()}
        return logits

    def extend(self, token_ids):
        before = self.model.num_generated
        logits = self.model.extend(token_ids)
        for i in range(len(token_ids)):  # row i follows generated token before + i: it predicts index before + i + 1
            self.rows[before + i + 1] = logits[i].clone()
        return logits


def _timed(generate: Callable[[], tuple[list[int], dict | None]]) -> Run:
    start = time.perf_counter()
    tokens, lengths = generate()
    return Run(tokens, time.perf_counter() - start, lengths)


class _Methods:
    """Loads what the chosen methods need, once, and runs one method on one prompt."""

    def __init__(self, target: str, methods: Sequence[str], threads: int | None, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.pipelines: dict[tuple[str, bool], Pipeline] = {}
        for name in methods:
            engine, kind = METHODS[name]
            if kind.startswith("ours"):
                auto = kind == "ours-auto"
                if (engine, auto) not in self.pipelines:
                    self.pipelines[(engine, auto)] = Pipeline.load(target, "auto" if auto else "none",
                                                                   backend=engine, threads=threads)
        first = next(iter(self.pipelines.values()), None) or Pipeline.load(target, "none", backend="llamacpp",
                                                                           threads=threads)
        self.tokenizer = first.tokenizer
        self.eos = first.eos_token_ids()
        self.llama = self.lookup = self.hf = None
        if any(METHODS[m][1] == "peer" and METHODS[m][0] == "llamacpp" for m in methods):
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            from specdecode.llamacpp.engine import default_threads
            from specdecode.llamacpp.loading import gguf_path

            path, n_threads = str(gguf_path(target)), threads or default_threads()
            # twice this bench's context: the binding's own speculative loop overran its score buffer near n_ctx
            options = dict(n_ctx=2 * _CONTEXT, n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
            if "llama.cpp" in methods:
                self.llama = Llama(path, **options)
            if "llama.cpp prompt lookup" in methods:
                self.lookup = Llama(path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4), **options)
        if "HF generate" in methods:
            from specdecode.models.loading import load_model

            self.hf = load_model(target).hf_model

    def encode(self, text: str) -> torch.Tensor:
        """The prompt's token ids [P] after the chat template, as every method gets them."""
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 return_dict=True)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def run(self, name: str, ids: torch.Tensor, temperature: float, seed: int) -> Run:
        engine, kind = METHODS[name]
        if kind.startswith("ours"):
            pipeline = self.pipelines[(engine, kind == "ours-auto")]

            def ours():
                result = pipeline.generate(ids, max_new_tokens=self.max_new_tokens,
                                           sampling=SamplingParams(temperature), seed=seed)
                return result.token_ids, result.stats.draft_lengths

            run = _timed(ours)
            if temperature == 0:  # again, recording the logits each token was chosen from (untimed)
                recorder = _LogitRecorder(pipeline.target.model)
                pipeline.target.model = recorder
                try:
                    again = pipeline.generate(ids, max_new_tokens=self.max_new_tokens, sampling=SamplingParams(0.0),
                                              seed=seed)
                finally:
                    pipeline.target.model = recorder.model
                if again.token_ids != run.tokens:
                    raise RuntimeError(f"{name}: a second greedy run gave other tokens than the first")
                run.logits = recorder.rows
            return run
        if name == "HF generate":
            return _timed(lambda: (self._hf(ids, temperature, seed), None))
        return _timed(lambda: (self._llama(self.llama if name == "llama.cpp" else self.lookup, ids, temperature,
                                           seed), None))

    def _llama(self, llm, ids: torch.Tensor, temperature: float, seed: int) -> list[int]:
        """The binding's own loop: pure sampling at temperature (no top-k, top-p, min-p or repeat penalty)."""
        llm.set_seed(seed)
        llm.reset()  # else the binding reuses the KV cache of the last run of this prompt and skips its prefill
        out: list[int] = []
        for token in llm.generate(ids.tolist(), temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
            out.append(int(token))
            if token in self.eos or len(out) == self.max_new_tokens:
                break
        return out

    def _hf(self, ids: torch.Tensor, temperature: float, seed: int) -> list[int]:
        torch.manual_seed(seed)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
            dict(do_sample=False)
        with torch.inference_mode():
            out = self.hf.generate(ids[None], attention_mask=torch.ones_like(ids[None]), max_new_tokens=self.max_new_tokens,
                                   eos_token_id=sorted(self.eos), pad_token_id=sorted(self.eos)[0], **sampling)
        return out[0, len(ids):].tolist()

def kernel_noise(model) -> float:
    """The largest logit difference between one call of 4 tokens and 4 one-token calls at the same positions,
    over contexts of 32 to 600 tokens: how far the engine's own kernels disagree with themselves."""
    feed = torch.arange(4) + 100
    worst = 0.0
    for length in (32, 128, 256, 400, 600):
        if length + 4 >= model.max_length:
            break
        context = (torch.arange(length) * 7919) % model.vocab_size
        model.prefill(context)
        batched = model.extend(feed)
        model.prefill(context)
        single = torch.stack([model.extend(feed[i:i + 1])[0] for i in range(len(feed))])
        worst = max(worst, float((batched - single).abs().max()))
    return worst


def _greedy_check(names: Sequence[str], runs: dict[str, Run], noise: dict[str, float]) -> dict:
    """Each of our speculative T=0 outputs against the same engine's target alone: identical, a near tie, or a
    MISMATCH. At the first differing token the logits each run chose it from are compared: a near tie when they
    differ by no more than twice the engine's kernel noise (each computation may be off by that), a MISMATCH
    (a bug: a wrong cache or position gives logits far apart) otherwise."""
    checks = {}
    for name in names:
        engine, kind = METHODS[name]
        alone = _OURS_ALONE.get(engine)
        if kind != "ours-auto" or alone not in runs:
            continue
        a, b = runs[name], runs[alone]
        if a.tokens == b.tokens:
            checks[name] = {"status": "identical"}
            continue
        at = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), min(len(a.tokens), len(b.tokens)))
        if at >= min(len(a.tokens), len(b.tokens)):  # one output is the other's prefix: no logits explain that
            checks[name] = {"status": "MISMATCH", "position": at}
            continue
        plain, spec = b.logits[at], a.logits[at]
        difference = float((plain - spec).abs().max())
        checks[name] = {"status": "near tie" if difference <= 2 * noise[engine] else "MISMATCH", "position": at,
                        "logit_gap": float(plain[b.tokens[at]] - plain[a.tokens[at]]), "logit_difference": difference,
                        "kernel_noise": noise[engine]}
    return checks


def run_engines_bench(prompts: Sequence[BenchPrompt], out: Path, target: str = DEFAULT_TARGET,
                      methods: Sequence[str] = tuple(METHODS), temperatures: Sequence[float] = (0.0, 1.0),
                      max_new_tokens: int = 128, threads: int | None = None, seed: int = 0) -> dict:
    """Run every method on every prompt at every temperature; write results.json and report.md after each prompt."""
    from tqdm import tqdm

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; choose from {list(METHODS)}")
    out.mkdir(parents=True, exist_ok=True)
    runner = _Methods(target, methods, threads, max_new_tokens)
    results = {"target": target, "methods": list(methods), "temperatures": list(temperatures),
               "max_new_tokens": max_new_tokens, "threads": threads,
               "machine": _machine(), "prompts": [],
               "kernel_noise": {engine: kernel_noise(runner.pipelines[(engine, False)].target.model)
                                for engine, auto in runner.pipelines if not auto}}
    for number, prompt in enumerate(tqdm(prompts, desc="prompts", unit="prompt", file=sys.stderr)):
        ids = runner.encode(prompt.text)
        if len(ids) + max_new_tokens >= _CONTEXT:
            continue
        record = {"question_id": prompt.question_id, "category": prompt.category, "prompt_tokens": len(ids), "runs": {}}
        for temperature in temperatures:
            order = list(methods[number % len(methods):]) + list(methods[: number % len(methods)])
            runs, entry = {}, {}
            for name in order:
                try:
                    runs[name] = runner.run(name, ids, temperature, seed + number)
                except (ValueError, RuntimeError) as error:  # another library's loop failing on this prompt: recorded
                    if METHODS[name][1] != "peer":
                        raise
                    entry[name] = {"error": f"{type(error).__name__}: {error}"}
            entry.update({name: {"tokens": len(r.tokens), "seconds": r.seconds, "rate": r.rate,
                                 **({"draft_lengths": r.draft_lengths} if r.draft_lengths else {})}
                          for name, r in runs.items()})
            if temperature == 0:
                entry["greedy"] = _greedy_check(methods, runs, results["kernel_noise"])
            record["runs"][str(temperature)] = entry
        results["prompts"].append(record)
        _write(results, out)
    _write(results, out)  # also when every prompt was too long
    return results


def _write(results: dict, out: Path) -> None:
    """results.json with a fresh summary, and report.md."""
    results["summary"] = summarize(results)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(render(results))


def _machine() -> dict:
    from specdecode.bench.run import machine_description
    from specdecode.timing_cache import cpu_name

    return {**machine_description(), "cpu": cpu_name()}


def summarize(results: dict) -> dict:
    """Per temperature and method: total tokens / total seconds, median speedup over the engine's baseline,
    the median speedup over our target alone on the same engine, and the greedy check counts."""
    summary = {}
    for t in map(str, results["temperatures"]):
        rows = [p["runs"][t] for p in results["prompts"] if t in p["runs"]]
        per_method = {}
        for name in results["methods"]:
            engine, kind = METHODS[name]
            done = [r[name] for r in rows if name in r and "error" not in r[name]]
            errors = sum(1 for r in rows if "error" in r.get(name, {}))
            if not done:
                continue
            row = {"tokens_per_s": sum(r["tokens"] for r in done) / sum(r["seconds"] for r in done), "prompts": len(done),
                   "errors": errors}
            for label, reference in (("vs_engine_peer", _BASELINE.get(engine)), ("vs_ours_alone", _OURS_ALONE.get(engine))):
                ratios = [r[name]["rate"] / r[reference]["rate"] for r in rows
                          if "rate" in r.get(name, {}) and "rate" in r.get(reference, {})]
                if ratios and reference != name:
                    row[label] = statistics.median(ratios)
                    row[label + "_min"] = min(ratios)
            lengths: dict[str, int] = {}
            for r in done:
                for g, n in r.get("draft_lengths", {}).items():
                    lengths[str(g)] = lengths.get(str(g), 0) + n
            if lengths:
                row["draft_lengths"] = dict(sorted(lengths.items(), key=lambda kv: int(kv[0])))
            checks = [r["greedy"][name]["status"] for r in rows if name in r.get("greedy", {})]
            if checks:
                row["greedy"] = {s: checks.count(s) for s in ("identical", "near tie", "MISMATCH")}
            per_method[name] = row
        summary[t] = per_method
    return summary


def headline_table(results: dict) -> str:
    """The markdown table of every method: tokens/s and speedups at each temperature, greedy identity at T=0."""
    summary = results["summary"]
    temps = list(summary)
    head = "| method | engine | " + " | ".join(
        f"T={t} tok/s | T={t} x target alone | T={t} x llama.cpp" for t in temps) + " | greedy (T=0) |"
    lines = [head, "|" + " --- |" * (2 + 3 * len(temps) + 1)]
    for name in results["methods"]:
        engine, _ = METHODS[name]
        cells = [name, engine]
        for t in temps:
            row = summary[t].get(name, {})
            llama = summary[t].get("llama.cpp", {}).get("tokens_per_s")
            cells.append(f"{row['tokens_per_s']:.1f}" if row else "")
            alone = row.get("vs_ours_alone")
            cells.append(f"{alone:.2f}x (min {row['vs_ours_alone_min']:.2f})" if alone else "")
            cells.append(f"{row['tokens_per_s'] / llama:.2f}x" if row and llama else "")
        greedy = summary[temps[0]].get(name, {}).get("greedy") if temps else None
        cells.append(", ".join(f"{n} {s}" for s, n in greedy.items() if n) if greedy else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(results: dict) -> str:
    """report.md: the headline table, how often each draft length was chosen, and any greedy divergence."""
    machine = results["machine"]
    text = [f"# Engines on {machine['cpu']} ({machine['cpus']} cores), {results['target']}\n",
            f"{len(results['prompts'])} prompts, {results['max_new_tokens']} new tokens, chat template, "
            "tokens/s = new tokens / wall seconds with the prefill. `x target alone`: median over prompts of the "
            "rate over our target alone on the same engine (min: the slowest prompt). `x llama.cpp`: over the "
            "binding's own loop.\n", headline_table(results)]
    for t, per_method in results["summary"].items():
        for name, row in per_method.items():
            if "draft_lengths" in row:
                text.append(f"- T={t}, {name}: draft tokens per call -> calls {row['draft_lengths']}\n")
    divergences = [(p["question_id"], name, c) for p in results["prompts"]
                   for name, c in p["runs"].get("0.0", {}).get("greedy", {}).items() if c["status"] != "identical"]
    for question, name, check in divergences:
        detail = (f", plain decoding preferred its token by {check['logit_gap']:.3f}, the two runs' logits there "
                  f"differ by up to {check['logit_difference']:.3f} (kernel noise {check['kernel_noise']:.3f})"
                  if "logit_gap" in check else "")
        text.append(f"- greedy {check['status']}: question {question}, {name}, first differing token "
                    f"{check['position']}{detail}\n")
    for p in results["prompts"]:
        for t, entry in p["runs"].items():
            for name, run in entry.items():
                if isinstance(run, dict) and "error" in run:
                    text.append(f"- {name} failed on question {p['question_id']} at T={t} (left out): {run['error']}\n")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdecode.bench.engines", description=__doc__.splitlines()[0],
                                     epilog="exit status 1 when a greedy output differs beyond the kernel noise")
    parser.add_argument("--prompts", default="../shared/data/spec_bench_dev.jsonl", help="a Spec-Bench JSONL file or humaneval")
    parser.add_argument("--limit", type=int, default=None, help="this many prompts, spread over the categories")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        prompts = load_prompts(args.prompts)
        if args.limit is not None:
            prompts = [prompts[i] for i in spread_subset(prompts, args.limit)]
        run_engines_bench(prompts, args.out, args.target, args.methods, args.temperatures, args.max_new_tokens,
                          args.threads)
    except (ValueError, FileNotFoundError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print((args.out / "report.md").read_text())
    results = json.loads((args.out / "results.json").read_text())
    summary = results.get("summary", {}).get("0.0", {})
    mismatches = sum(row.get("greedy", {}).get("MISMATCH", 0) for row in summary.values())
    if mismatches:
        print(f"GREEDY MISMATCH on {mismatches} prompt(s): speculative output differs from the target alone beyond "
              "the engine's kernel noise (a bug, please report it)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
