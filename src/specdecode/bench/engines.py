"""`python -m specdecode.bench.engines`: every engine, and what a user would run instead, on the same prompts in one run.

Methods (each prompt x temperature runs every method once, in an order that rotates per prompt):
- `llama.cpp`: llama-cpp-python's own generation loop (`Llama.generate`) on the same token ids: the peer;
- `llama.cpp prompt lookup`: the binding's own speculative mode (`LlamaPromptLookupDecoding`);
- `llama.cpp speculative DRAFT`: the binding's speculative loop with the model DRAFT on llama.cpp proposing
  4 greedy tokens a call (`LlamaModelDraft`; the binding ships no model draft of its own);
- `HF generate`, `HF assisted DRAFT`: transformers' `generate` on the same GGUF file (dequantized to float32),
  alone and with DRAFT as its assistant model;
- ours: `ours ENGINE [--dtype D] target alone`, or `ours ENGINE [--dtype D] --draft SPEC [--draft-backend B]
  [--gamma G]` (`Pipeline.load`'s options; `--draft auto` without a gamma: cost-aware draft lengths).
Each run's rate is new tokens over wall seconds, prefill included. A method's speedup is the median over
prompts of its rate over the same engine's target alone (same dtype) on that prompt. At T = 0 each of our
speculative outputs is compared with the same engine's target alone, at the first differing token, on the
logits each run chose its token from (recorded in a second, untimed run): a near tie when they differ by no
more than twice the engine's kernel noise (`kernel_noise`: llama.cpp's kernels for several tokens round
differently from its one-token kernels once the context passes about 256 tokens), a MISMATCH otherwise.
For our speculative methods the report adds tokens per call, the acceptance at each draft position, the
draft's cost c (its seconds per draft token over T(1)), and the speedup Thm 3.8 predicts from them and the
engine's measured T(k)/T(1), next to the measured one.
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
from specdecode import backends
from specdecode.models.loading import DEFAULT_TARGET, LoadedModel
from specdecode.pipeline import Pipeline, auto_entry

__all__ = ["METHODS", "Method", "parse_method", "LlamaModelDraft", "run_engines_bench", "headline_table", "speculation_table", "main"]
_CONTEXT = 2048  # llama.cpp's context in this bench: prompts longer than this less the new tokens are skipped

# The default methods: the default target on every engine, and its peers
METHODS = (
    "llama.cpp",
    "llama.cpp prompt lookup",
    "HF generate",
    "ours llamacpp target alone",
    "ours llamacpp --draft auto",
    "ours native target alone",
    "ours native --draft auto",
)


@dataclass(frozen=True)
class Method:
    """A method's name parsed: engine ('llamacpp', 'native', 'hf'), dtype, kind ('peer' or 'ours'), and for ours
    the Pipeline.load draft options (draft None: the target alone); for a speculative peer its draft model."""

    name: str
    engine: str
    kind: str
    dtype: str = "float32"
    draft: str | None = None
    draft_backend: str | None = None
    gamma: int | None = None

    @property
    def group(self) -> str:
        """The engine and weights a speedup is measured within: 'native', 'native bfloat16', 'llamacpp', 'hf'."""
        return self.engine if self.dtype == "float32" else f"{self.engine} {self.dtype}"


_PEERS = {"llama.cpp": "llamacpp", "llama.cpp prompt lookup": "llamacpp", "HF generate": "hf"}
_SPECULATIVE_PEERS = {"llama.cpp speculative ": "llamacpp", "HF assisted ": "hf"}


def parse_method(name: str) -> Method:
    """The Method a name describes, or a ValueError naming what is wrong with it."""
    if name in _PEERS:
        return Method(name, _PEERS[name], "peer")
    for prefix, engine in _SPECULATIVE_PEERS.items():
        if name.startswith(prefix) and name[len(prefix):].strip():
            return Method(name, engine, "peer", draft=name[len(prefix):].strip())
    words = name.split()
    if len(words) < 3 or words[0] != "ours" or words[1] not in ("llamacpp", "native", "hf"):
        raise ValueError(f"methods: {name!r} is none of {', '.join(_PEERS)}, 'llama.cpp speculative DRAFT', "
                         "'HF assisted DRAFT', 'ours ENGINE [--dtype D] target alone', 'ours ENGINE [--dtype D] "
                         "--draft SPEC [--draft-backend B] [--gamma G]'")
    options = argparse.ArgumentParser(prog=f"method {name!r}", add_help=False, exit_on_error=False)
    options.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    options.add_argument("--draft")
    options.add_argument("--draft-backend", choices=("auto", "llamacpp", "native", "hf"))
    options.add_argument("--gamma", type=int)
    rest = words[2:]
    alone = rest[-2:] == ["target", "alone"]
    try:
        parsed = options.parse_args(rest[:-2] if alone else rest)
    except (argparse.ArgumentError, SystemExit) as error:
        raise ValueError(f"methods: {name!r}: {error}") from None
    if alone == (parsed.draft is not None):
        raise ValueError(f"methods: {name!r} must end in 'target alone' or name a --draft, not both")
    return Method(name, words[1], "ours", parsed.dtype, parsed.draft, parsed.draft_backend, parsed.gamma)


def _baselines(methods: Sequence[Method]) -> tuple[dict[str, str], dict[str, str]]:
    """(group -> the peer speedups are measured against, group -> our target alone in that group)."""
    alone = {m.group: m.name for m in methods if m.kind == "ours" and m.draft is None}
    peer = {"llamacpp": "llama.cpp", "hf": "HF generate", **{g: n for g, n in alone.items() if g.startswith("native")}}
    return peer, alone


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    draft_lengths: dict[int, int] | None = None
    logits: dict[int, torch.Tensor] | None = None  # at T=0: generated index -> the logits [V] it was chosen from
    stats: dict | None = None  # ours: the GenerationStats counters `_speculation` reads

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


_STATS = ("target_calls", "draft_tokens", "accepted_tokens", "proposed_per_position", "accepted_per_position",
          "draft_seconds", "draft_start_seconds", "target_seconds", "first_token_seconds", "seconds", "new_tokens")


def _timed(generate: Callable[[], tuple[list[int], dict | None]]) -> Run:
    start = time.perf_counter()
    tokens, lengths = generate()
    return Run(tokens, time.perf_counter() - start, lengths)


class LlamaModelDraft:
    """A draft model for llama-cpp-python's speculative loop (`Llama(draft_model=...)`): another `Llama` that
    proposes `tokens` greedy tokens after the context it is given, keeping its KV cache for the common prefix."""

    def __init__(self, llm, tokens: int = 4) -> None:
        self.llm, self.tokens = llm, tokens

    def __call__(self, input_ids, /, **kwargs):
        import numpy as np

        import llama_cpp

        llm, ids = self.llm, [int(t) for t in input_ids]
        have = [int(t) for t in llm.input_ids[:llm.n_tokens]]
        common = next((i for i, (a, b) in enumerate(zip(have, ids)) if a != b), min(len(have), len(ids)))
        llm.n_tokens = min(common, len(ids) - 1)  # at least the last token is evaluated anew, for its logits
        llm.eval(ids[llm.n_tokens:])
        out = []
        for _ in range(self.tokens):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
            out.append(int(logits.argmax()))
            llm.eval(out[-1:])
        return np.array(out, dtype=np.intc)


class _Methods:
    """Loads what the chosen methods need, once, and runs one method on one prompt."""

    def __init__(self, target: str, methods: Sequence[Method], threads: int | None, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.pipelines: dict[str, Pipeline] = {}  # our method's name -> its pipeline
        targets: dict[str, LoadedModel] = {}  # group -> the target our methods in it share
        for m in methods:
            if m.kind == "ours":
                if m.group not in targets:  # a native target's layout is timed for up to 6 tokens per call
                    targets[m.group] = backends.load(target, m.engine, rows_per_call=6, threads=threads, dtype=m.dtype)
                entry = auto_entry(m.draft, target, m.engine)  # 'auto': the pair's draft engine, as Pipeline.load
                draft_backend = m.draft_backend or (entry.draft_backend if entry else None) or m.engine
                self.pipelines[m.name] = Pipeline.around(targets[m.group], m.draft or "none", m.gamma, draft_backend,
                                                         dtype=m.dtype)
        first = next(iter(self.pipelines.values()), None) or Pipeline.load(target, "none", backend="llamacpp",
                                                                           threads=threads)
        self.tokenizer = first.tokenizer
        self.eos = first.eos_token_ids()
        self.llamas: dict[str, object] = {}  # a llama.cpp peer's name -> its Llama
        self.hf = None
        self.assistants: dict[str, object] = {}  # an HF assisted peer's name -> its draft model
        peers = [m for m in methods if m.kind == "peer"]
        if any(m.engine == "llamacpp" for m in peers):
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            from specdecode.llamacpp.engine import default_threads
            from specdecode.llamacpp.loading import gguf_path

            path, n_threads = str(gguf_path(target)), threads or default_threads()
            # twice this bench's context: the binding's own speculative loop overran its score buffer near n_ctx
            options = dict(n_ctx=2 * _CONTEXT, n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
            for m in peers:
                if m.name == "llama.cpp":
                    self.llamas[m.name] = Llama(path, **options)
                elif m.name == "llama.cpp prompt lookup":
                    self.llamas[m.name] = Llama(path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4), **options)
                elif m.engine == "llamacpp":
                    draft = Llama(str(gguf_path(m.draft)), **options)
                    self.llamas[m.name] = Llama(path, draft_model=LlamaModelDraft(draft), **options)
        if any(m.engine == "hf" for m in peers):
            from specdecode.models.loading import load_model

            self.hf = load_model(target).hf_model
            for m in peers:
                if m.draft is not None and m.engine == "hf":
                    self.assistants[m.name] = load_model(m.draft).hf_model

    def encode(self, text: str) -> torch.Tensor:
        """The prompt's token ids [P] after the chat template, as every method gets them."""
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 return_dict=True)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def run(self, m: Method, ids: torch.Tensor, temperature: float, seed: int) -> Run:
        if m.kind == "ours":
            pipeline = self.pipelines[m.name]
            stats: dict = {}

            def ours():
                result = pipeline.generate(ids, max_new_tokens=self.max_new_tokens,
                                           sampling=SamplingParams(temperature), seed=seed)
                stats.update({key: getattr(result.stats, key) for key in _STATS})
                return result.token_ids, result.stats.draft_lengths

            run = _timed(ours)
            run.stats = stats
            if temperature == 0:  # again, recording the logits each token was chosen from (untimed)
                recorder = _LogitRecorder(pipeline.target.model)
                pipeline.target.model = recorder
                try:
                    again = pipeline.generate(ids, max_new_tokens=self.max_new_tokens, sampling=SamplingParams(0.0),
                                              seed=seed)
                finally:
                    pipeline.target.model = recorder.model
                if again.token_ids != run.tokens:
                    raise RuntimeError(f"{m.name}: a second greedy run gave other tokens than the first")
                run.logits = recorder.rows
            return run
        if m.engine == "hf":
            return _timed(lambda: (self._hf(ids, temperature, seed, self.assistants.get(m.name)), None))
        return _timed(lambda: (self._llama(self.llamas[m.name], ids, temperature, seed), None))

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

    def _hf(self, ids: torch.Tensor, temperature: float, seed: int, assistant=None) -> list[int]:
        torch.manual_seed(seed)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
            dict(do_sample=False)
        if assistant is not None:
            sampling.update(assistant_model=assistant)
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


def _greedy_check(methods: Sequence[Method], runs: dict[str, Run], noise: dict[str, float]) -> dict:
    """Each of our speculative T=0 outputs against the same engine's target alone: identical, a near tie, or a
    MISMATCH. At the first differing token the logits each run chose it from are compared: a near tie when they
    differ by no more than twice the engine's kernel noise (each computation may be off by that), a MISMATCH
    (a bug: a wrong cache or position gives logits far apart) otherwise."""
    _, alone = _baselines(methods)
    checks = {}
    for m in methods:
        plain_name = alone.get(m.group)
        if m.kind != "ours" or m.draft is None or m.name not in runs or plain_name not in runs:
            continue
        a, b = runs[m.name], runs[plain_name]
        if a.tokens == b.tokens:
            checks[m.name] = {"status": "identical"}
            continue
        at = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), min(len(a.tokens), len(b.tokens)))
        if at >= min(len(a.tokens), len(b.tokens)):  # one output is the other's prefix: no logits explain that
            checks[m.name] = {"status": "MISMATCH", "position": at}
            continue
        plain, spec = b.logits[at], a.logits[at]
        difference = float((plain - spec).abs().max())
        checks[m.name] = {"status": "near tie" if difference <= 2 * noise[m.group] else "MISMATCH", "position": at,
                          "logit_gap": float(plain[b.tokens[at]] - plain[a.tokens[at]]),
                          "logit_difference": difference, "kernel_noise": noise[m.group]}
    return checks


WARM_UP_TOKENS = 8


def warm_up(runner: _Methods, methods: Sequence[Method], ids: torch.Tensor, tokens: int = WARM_UP_TOKENS) -> None:
    """One short untimed greedy run of every method before any is timed. The first call of an engine pays for
    paging its weights in (a memory-mapped GGUF of a GB), oneDNN's first kernels and llama.cpp's first graphs:
    without this, the first method of the first prompt ran 4x slower than its other runs in one bench."""
    full, runner.max_new_tokens = runner.max_new_tokens, tokens
    try:
        for m in methods:
            runner.run(m, ids, 0.0, 0)
    finally:
        runner.max_new_tokens = full


def run_engines_bench(prompts: Sequence[BenchPrompt], out: Path, target: str = DEFAULT_TARGET,
                      methods: Sequence[str] = METHODS, temperatures: Sequence[float] = (0.0, 1.0),
                      max_new_tokens: int = 128, threads: int | None = None, seed: int = 0) -> dict:
    """Run every method on every prompt at every temperature; write results.json and report.md after each prompt."""
    from tqdm import tqdm

    parsed = [parse_method(name) for name in methods]  # a bad name fails before anything loads
    out.mkdir(parents=True, exist_ok=True)
    runner = _Methods(target, parsed, threads, max_new_tokens)
    _, alone = _baselines(parsed)
    results = {"target": target, "methods": list(methods), "temperatures": list(temperatures),
               "max_new_tokens": max_new_tokens, "threads": threads,
               "machine": machine(), "prompts": [],
               "kernel_noise": {group: kernel_noise(runner.pipelines[name].target.model) for group, name in alone.items()},
               "costs": _costs(runner, parsed), "warm_up_tokens": WARM_UP_TOKENS}
    if prompts:
        warm_up(runner, parsed, runner.encode(prompts[0].text))
    for number, prompt in enumerate(tqdm(prompts, desc="prompts", unit="prompt", file=sys.stderr)):
        ids = runner.encode(prompt.text)
        if len(ids) + max_new_tokens >= _CONTEXT:
            continue
        record = {"question_id": prompt.question_id, "category": prompt.category, "prompt_tokens": len(ids), "runs": {}}
        for temperature in temperatures:
            order = parsed[number % len(parsed):] + parsed[: number % len(parsed)]
            runs, entry = {}, {}
            for m in order:
                try:
                    runs[m.name] = runner.run(m, ids, temperature, seed + number)
                except (ValueError, RuntimeError) as error:  # another library's loop failing on this prompt: recorded
                    if m.kind != "peer":
                        raise
                    entry[m.name] = {"error": f"{type(error).__name__}: {error}"}
            entry.update({name: {"tokens": len(r.tokens), "seconds": r.seconds, "rate": r.rate,
                                 **({"draft_lengths": r.draft_lengths} if r.draft_lengths else {}),
                                 **({"stats": r.stats} if r.stats else {})}
                          for name, r in runs.items()})
            if temperature == 0:
                entry["greedy"] = _greedy_check(parsed, runs, results["kernel_noise"])
            record["runs"][str(temperature)] = entry
        results["prompts"].append(record)
        _write(results, out)
    _write(results, out)  # also when every prompt was too long
    return results


def _costs(runner: _Methods, methods: Sequence[Method]) -> dict:
    """Per group of our methods: T(k)/T(1) of its target for k up to the largest gamma + 1 (cached timings) and
    T(1) in seconds, for Thm 3.8's prediction."""
    from specdecode.cost_profile import measure_cost_profile

    _, alone = _baselines(methods)
    rows = max([6, *((m.gamma or 5) + 1 for m in methods if m.kind == "ours" and m.draft)])
    out = {}
    for group, name in alone.items():
        profile = measure_cost_profile(runner.pipelines[name].target.model, rows)
        out[group] = {"t1_seconds": profile.target_seconds[1], "switch_seconds": profile.switch_seconds,
                      "ratios": {str(k): profile.verify_ratio(k) for k in sorted(profile.target_seconds)}}
    return out


def _write(results: dict, out: Path) -> None:
    """results.json with a fresh summary, and report.md."""
    results["summary"] = summarize(results)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(render(results))


def machine() -> dict:
    """The machine as the bench records it: machine_description() and the CPU's model name."""
    from specdecode.bench.run import machine_description
    from specdecode.timing_cache import cpu_name

    return {**machine_description(), "cpu": cpu_name()}


def summarize(results: dict) -> dict:
    """Per temperature and method: total tokens / total seconds, median speedup over the engine's baseline,
    the median speedup over our target alone on the same engine, and the greedy check counts."""
    methods = [parse_method(name) for name in results["methods"]]
    peer, alone = _baselines(methods)
    summary = {}
    for t in map(str, results["temperatures"]):
        rows = [p["runs"][t] for p in results["prompts"] if t in p["runs"]]
        per_method = {}
        for m in methods:
            name = m.name
            done = [r[name] for r in rows if name in r and "error" not in r[name]]
            errors = sum(1 for r in rows if "error" in r.get(name, {}))
            if not done:
                continue
            row = {"tokens_per_s": sum(r["tokens"] for r in done) / sum(r["seconds"] for r in done), "prompts": len(done),
                   "errors": errors}
            for label, reference in (("vs_engine_peer", peer.get(m.group)), ("vs_ours_alone", alone.get(m.group))):
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
            if m.kind == "ours" and m.draft is not None and m.group in results.get("costs", {}):
                plain = [r[alone[m.group]] for r in rows if name in r and "stats" in r.get(alone[m.group], {})]
                row.update(_speculation([r for r in done if "stats" in r], plain, results["costs"][m.group]))
            per_method[name] = row
        summary[t] = per_method
    return summary


def _decode_rate(runs: Sequence[dict]) -> float:
    """Tokens after the first over the seconds after the first token: decoding without the prefills."""
    tokens = sum(r["stats"]["new_tokens"] - 1 for r in runs)
    seconds = sum(r["stats"]["seconds"] - r["stats"]["first_token_seconds"] for r in runs)
    return tokens / seconds if seconds > 0 else 0.0


def _speculation(runs: Sequence[dict], plain: Sequence[dict], costs: dict) -> dict:
    """Tokens per call, acceptance per draft position, c, and Thm 3.8's speedup from them and T(k)/T(1) (the
    calls' measured draft lengths, each at T(g+1)/T(1) + g c) against the measured one (decode rates, without
    the prefills, over the target alone's)."""
    if not runs or not plain:
        return {}
    stats = [r["stats"] for r in runs]
    calls = sum(s["target_calls"] - 1 for s in stats)  # the prefill is not a decoding call
    tokens = sum(s["new_tokens"] - 1 for s in stats)
    proposed = [sum(col) for col in zip(*(s["proposed_per_position"] for s in stats))]
    accepted = [sum(col) for col in zip(*(s["accepted_per_position"] for s in stats))]
    draft_tokens = sum(s["draft_tokens"] for s in stats)
    draft_seconds = sum(s["draft_seconds"] - s.get("draft_start_seconds", 0.0) for s in stats)  # without its prefill
    c = draft_seconds / draft_tokens / costs["t1_seconds"] if draft_tokens else 0.0
    lengths: dict[str, int] = {}
    for r in runs:
        for g, n in r.get("draft_lengths", {}).items():
            lengths[str(g)] = lengths.get(str(g), 0) + n
    ratios = costs["ratios"]
    cost = sum(n * ratios[str(int(g) + 1)] for g, n in lengths.items() if str(int(g) + 1) in ratios) + draft_tokens * c
    out = {"tokens_per_call": tokens / calls if calls else 0.0, "c": c,
           "alpha_per_position": [a / n if n else None for a, n in zip(accepted, proposed)]}
    if cost > 0:
        out["predicted_speedup"] = tokens / cost
        out["measured_speedup"] = _decode_rate(runs) / _decode_rate(plain)
    return out


def headline_table(results: dict) -> str:
    """The markdown table of every method: tokens/s and speedups at each temperature, greedy identity at T=0."""
    summary = results["summary"]
    temps = list(summary)
    head = "| method | engine | " + " | ".join(
        f"T={t} tok/s | T={t} x target alone | T={t} x llama.cpp" for t in temps) + " | greedy (T=0) |"
    lines = [head, "|" + " --- |" * (2 + 3 * len(temps) + 1)]
    for name in results["methods"]:
        cells = [name, parse_method(name).group]
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


def speculation_table(results: dict) -> str:
    """The markdown table of our speculative methods: tokens per call, acceptance per draft position, c, and
    Thm 3.8's speedup against the measured one (decode rates); empty where no run recorded its counters."""
    lines = []
    for t, per_method in results["summary"].items():
        for name, row in per_method.items():
            if "tokens_per_call" not in row:
                continue
            alphas = " ".join("-" if a is None else f"{a:.2f}" for a in row["alpha_per_position"])
            predicted, measured = row.get("predicted_speedup"), row.get("measured_speedup")
            ratio = f"{measured / predicted:.2f}" if predicted and measured else ""
            lines.append(f"| {t} | {name} | {row['tokens_per_call']:.2f} | {alphas} | {row['c']:.3f} | "
                         f"{predicted or 0:.2f}x | {measured or 0:.2f}x | {ratio} |")
    if not lines:
        return ""
    head = ("| T | method | tokens per call | acceptance per draft position | c | Thm 3.8 speedup | measured | "
            "measured / predicted |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
    return head + "\n".join(lines) + "\n"


def costs_table(results: dict) -> str:
    """T(1) and T(k)/T(1) of each engine's target, as measured for the prediction."""
    costs = results.get("costs", {})
    if not costs:
        return ""
    ks = sorted({int(k) for c in costs.values() for k in c["ratios"]})
    lines = ["| engine | T(1) ms | " + " | ".join(f"T({k})/T(1)" for k in ks) + " |",
             "|" + " --- |" * (2 + len(ks))]
    for group, c in costs.items():
        lines.append(f"| {group} | {1000 * c['t1_seconds']:.1f} | "
                     + " | ".join(f"{c['ratios'].get(str(k), 0):.2f}" for k in ks) + " |")
    return "\n".join(lines) + "\n"


def render(results: dict) -> str:
    """report.md: the headline table, how often each draft length was chosen, and any greedy divergence."""
    machine = results["machine"]
    text = [f"# Engines on {machine['cpu']} ({machine['cpus']} cores), {results['target']}\n",
            f"{len(results['prompts'])} prompts, {results['max_new_tokens']} new tokens, chat template, "
            "tokens/s = new tokens / wall seconds with the prefill. `x target alone`: median over prompts of the "
            "rate over our target alone on the same engine (min: the slowest prompt). `x llama.cpp`: over the "
            "binding's own loop.\n", headline_table(results)]
    if speculation_table(results):
        text += ["Speculation, summed over the prompts (c: the draft's seconds per draft token, without its prefill, "
                 "over the target's T(1); Thm 3.8's speedup from the calls' draft lengths at the measured T(k)/T(1) "
                 "and c; measured: decode rates without the prefills over the target alone's):\n",
                 speculation_table(results), "Verification costs of each engine's target (cached timings):\n",
                 costs_table(results)]
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
    parser.add_argument("--prompts", nargs="+", default=["../shared/data/spec_bench_dev.jsonl"],
                        help="Spec-Bench JSONL files or built-in tasks (humaneval), one after the other")
    parser.add_argument("--limit", type=int, default=None, help="this many prompts of each, spread over the categories")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), metavar="METHOD",
                        help="methods (see above; default: the default target's engines and peers)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        prompts = []
        for source in args.prompts:
            loaded = load_prompts(source)
            prompts += loaded if args.limit is None else [loaded[i] for i in spread_subset(loaded, args.limit)]
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
