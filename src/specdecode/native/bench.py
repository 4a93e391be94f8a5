"""Speed, agreement, time to first token and memory of the native engine on the default model (SmolLM2-135M).

    python -m specdecode.native.bench [--quick] [--with-compile] [--threads N]
                                      [--out bench.json] [--markdown docs/native-benchmark.md]

In this process, each measurement interleaved across variants (a busy machine slows all alike), medians:
- greedy: plain greedy decoding (no draft) of --new-tokens tokens after a chat prompt, tokens/s end to end,
  prefill included. `hf-generate` is transformers' own `model.generate(do_sample=False)`; `hf` is
  specdecode's loop on the transformers adapter; the others are the native engine;
- T(k): one `extend` of k tokens after --context tokens, rolled back, k = 1..--max-k. T(k)/T(1) is what
  verifying k tokens costs relative to one decoding step;
- top-1 agreement: how often each variant's argmax equals the float32 eager engine's, teacher-forced on
  chat prompts followed by the float32 greedy continuation.
In fresh processes (`specdecode.native.probe`), after one discarded run that warms the disk cache:
- TTFT: interpreter start and imports + load + prefill + first token, per configuration;
- RSS: target + draft (--draft: 'bundled', the distilled draft shipped for the default model;
  'truncated:N', the default model's first N layers; or a model path) after a short speculative generation.
--quick (about 2 minutes on 2 idle cores) takes fewer repetitions and shorter runs; the default run takes
about 10 minutes; --with-compile adds torch.compile (about 6 more minutes of compilation).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.models.base import LanguageModel
from specdecode.models.hf import HFCausalLM
from specdecode.models.loading import default_gguf_path, load_model
from specdecode.native.engine import NativeLM
from specdecode.native.loading import native_from_gguf
from specdecode.native.probe import PROMPT, run_probe

GREEDY = SamplingParams(0.0)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}  # cpu: this thread's CPU time (with --threads 1)
Clock = Callable[[], float]
AGREEMENT_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five tips for writing clean Python code, with one sentence each.",
    "Summarize the causes of the French Revolution in a paragraph.",
    "Translate to French: The weather is nice today and we are going to the park.",
)
DESCRIPTIONS = {
    "hf-generate": "transformers `generate(do_sample=False)`, float32",
    "hf": "specdecode loop on the transformers adapter, float32",
    "eager": "native float32, plain `nn.Linear` (packing='none')",
    "packed": "native float32, oneDNN-packed weights (packing='packed')",
    "default": "native float32, `NativeLM` defaults (packing='auto': dual on CPU)",
    "bf16": "native bfloat16 (packing='auto': oneDNN-packed where the CPU has bfloat16 support, else plain)",
    "int8": "native float32, weight-only int8 (quantize='int8', bfloat16 matmul inputs)",
    "int8-bf16": "native bfloat16, weight-only int8",
    "compiled": "native float32, torch.compile (inductor, freezing)",
}
VARIANTS = tuple(DESCRIPTIONS)
DEFAULT_VARIANTS = ("hf-generate", "hf", "eager", "packed", "default", "bf16", "int8")
PROBE_CONFIGS = {  # name -> probe options; TTFT and RSS are measured per configuration
    "default": (),
    "bf16": ("--dtype", "bfloat16"),
    "int8": ("--quantize", "int8"),
    "hf": ("--backend", "hf"),
}
TARGETS = {"speedup": 3.0, "t5": 1.3, "t8": 1.5, "ttft_s": 5.0, "rss_mb": 1500.0}


@dataclass
class Settings:
    context: int
    max_k: int
    reps: int
    new_tokens: int
    greedy_reps: int
    agree_prompts: int
    agree_tokens: int
    probe_runs: int
    ttft_configs: tuple[str, ...]
    rss_configs: tuple[str, ...]


FULL = Settings(context=200, max_k=16, reps=7, new_tokens=64, greedy_reps=3, agree_prompts=4, agree_tokens=64,
                probe_runs=3, ttft_configs=("default", "int8", "bf16", "hf"), rss_configs=("default", "int8", "bf16"))
QUICK = Settings(context=200, max_k=16, reps=3, new_tokens=32, greedy_reps=1, agree_prompts=2, agree_tokens=48,
                 probe_runs=1, ttft_configs=("default", "int8"), rss_configs=("default", "int8", "bf16"))


# --------------------------------------------------------------------------- variants


def _native(dtype: torch.dtype = torch.float32, **options) -> Callable[[], NativeLM]:
    def build() -> NativeLM:
        model, _ = native_from_gguf(default_gguf_path(), dtype, with_tokenizer=False)
        return NativeLM(model, name="native", max_cache_len=1024, **options)

    return build


def _builders(hf_model) -> dict[str, Callable[[], LanguageModel]]:
    return {
        "hf": lambda: HFCausalLM(hf_model, name="hf"),
        "eager": _native(packing="none"),
        "packed": _native(packing="packed"),
        "default": _native(),
        "bf16": _native(torch.bfloat16),
        "int8": _native(quantize="int8"),
        "int8-bf16": _native(torch.bfloat16, quantize="int8"),
        "compiled": _native(compile=True),
    }


def _describe(model: LanguageModel) -> dict:
    if not isinstance(model, NativeLM):
        return {}
    return {"packing": model.packing, "quantize": model.quantize, "dtype": str(model.model.dtype)}


# --------------------------------------------------------------------------- in-process measurements


def warm_up(model: LanguageModel, context: torch.Tensor, max_k: int, clock: Clock = time.perf_counter) -> float:
    """Run every shape once (compiles a compiled variant); return the seconds it took."""
    start = clock()
    model.prefill(context)
    for k in range(1, max_k + 1):
        model.extend(context[:k])
        model.rollback(0)
    return clock() - start


def _rotated(names: list[str], rep: int) -> list[str]:
    shift = rep % len(names)
    return names[shift:] + names[:shift]


def time_forward(
    models: dict[str, LanguageModel], context: torch.Tensor, max_k: int, reps: int, clock: Clock = time.perf_counter
) -> dict:
    """Median seconds of extend(k tokens) per variant and k, after prefilling `context`."""
    for model in models.values():
        model.prefill(context)
    generator = torch.Generator().manual_seed(0)
    times: dict[str, dict[int, list[float]]] = {name: {k: [] for k in range(1, max_k + 1)} for name in models}
    for rep in range(reps):
        for k in range(1, max_k + 1):
            feed = context[torch.randint(0, len(context), (k,), generator=generator)]  # ids the models know
            for name in _rotated(list(models), rep):
                start = clock()
                models[name].extend(feed)
                times[name][k].append(clock() - start)
                models[name].rollback(0)
    return {name: {k: statistics.median(v) for k, v in per_k.items()} for name, per_k in times.items()}


def _hf_generate(hf_model, tokenizer, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """transformers' own greedy decoding."""
    ids = prompt[None]
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                            pad_token_id=tokenizer.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


def time_greedy(runners: dict[str, Callable[[], list[int]]], reps: int, clock: Clock = time.perf_counter) -> dict:
    """Median tokens/s of each runner (a full greedy decoding), interleaved; the tokens of its last run."""
    rates: dict[str, list[float]] = {name: [] for name in runners}
    tokens: dict[str, list[int]] = {}
    for rep in range(reps):
        for name in _rotated(list(runners), rep):
            start = clock()
            tokens[name] = runners[name]()
            rates[name].append(len(tokens[name]) / (clock() - start))
    return {name: {"tokens_per_s": statistics.median(r), "token_ids": tokens[name]} for name, r in rates.items()}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's distinct parameters: what one decoding step streams from memory (float32 here)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def streaming_seconds(nbytes: int, reps: int, clock: Clock = time.perf_counter) -> float:
    """Median seconds to read nbytes once (a sum over a float32 tensor that size): the memory-bound floor."""
    data = torch.ones(nbytes // 4)
    times = []
    for _ in range(reps + 1):
        start = clock()
        data.sum()
        times.append(clock() - start)
    return statistics.median(times[1:])  # the first run also faults the pages in


def teacher_forced_argmax(model: LanguageModel, sequence: torch.Tensor) -> torch.Tensor:
    """The model's argmax at every position of `sequence` [L] (one prefill token, then one extend)."""
    first = model.prefill(sequence[:1])[None]
    rest = model.extend(sequence[1:])
    return torch.cat([first, rest]).argmax(dim=-1)


def top1_agreement(models: dict[str, LanguageModel], reference: LanguageModel, sequences: list[torch.Tensor]) -> dict:
    """Fraction of positions where each model's argmax equals the reference's, over all sequences."""
    expected = [teacher_forced_argmax(reference, seq) for seq in sequences]
    result = {}
    for name, model in models.items():
        same = sum(int((teacher_forced_argmax(model, seq) == ref).sum()) for seq, ref in zip(sequences, expected))
        result[name] = same / sum(len(ref) for ref in expected)
    return result


# --------------------------------------------------------------------------- fresh-process measurements


def measure_ttft(configs: tuple[str, ...], runs: int, threads: int | None) -> dict:
    """Median TTFT (and its parts) per configuration, each run in a fresh process, after one warm-up run."""
    extra = ("--threads", str(threads)) if threads else ()
    run_probe("ttft", *extra)  # warms the disk cache; discarded
    out = {}
    for name in configs:
        samples = [run_probe("ttft", *PROBE_CONFIGS[name], *extra) for _ in range(runs)]
        out[name] = {key: statistics.median(s[key] for s in samples)
                     for key in ("imports_s", "load_s", "prefill_s", "ttft_s", "cpu_s")}
    return out


def measure_rss(configs: tuple[str, ...], draft: str, threads: int | None) -> dict:
    extra = ("--threads", str(threads)) if threads else ()
    return {name: run_probe("rss", *PROBE_CONFIGS[name], "--draft", draft, *extra) for name in configs}


# --------------------------------------------------------------------------- report


def from_json(report: dict) -> dict:
    """A report as read back from --out's JSON, with T(k)'s k as ints again (JSON object keys are strings)."""
    forward = {name: {int(k): seconds for k, seconds in per_k.items()} for name, per_k in report["forward_seconds"].items()}
    return {**report, "forward_seconds": forward}


def _cell(value, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def _ratio(forward: dict, name: str, k: int) -> float | None:
    per_k = forward.get(name)
    return None if per_k is None or k not in per_k else per_k[k] / per_k[1]


def _same_tokens(greedy: dict, name: str) -> bool | None:
    if "hf-generate" not in greedy:
        return None
    theirs, ours = greedy["hf-generate"]["token_ids"], greedy[name]["token_ids"]
    n = min(len(theirs), len(ours))
    return n > 0 and ours[:n] == theirs[:n]


def speed_table(report: dict) -> list[str]:
    greedy, forward, agree = report["greedy"], report["forward_seconds"], report["top1_agreement"]
    base = greedy.get("hf-generate", {}).get("tokens_per_s")
    rows = ["| variant | what | greedy tok/s | x HF generate | same tokens as HF generate | top-1 vs fp32 "
            "| T(1) ms | T(5)/T(1) | T(8)/T(1) | T(16)/T(1) |", "|" + "---|" * 10]
    for name in report["variants"]:
        rate = greedy[name]["tokens_per_s"]
        t1 = forward[name][1] * 1000 if name in forward else None
        same = _same_tokens(greedy, name)
        cells = [name, DESCRIPTIONS[name], f"{rate:.1f}", _cell(rate / base if base else None),
                 "–" if same is None else str(same), _cell(agree.get(name), "{:.3f}"), _cell(t1, "{:.1f}"),
                 _cell(_ratio(forward, name, 5)), _cell(_ratio(forward, name, 8)), _cell(_ratio(forward, name, 16))]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def floor_lines(report: dict) -> list[str]:
    """What memory bandwidth allows: reading the float32 weights once is the floor of a float32 decoding step."""
    nbytes, floor = report["fp32_weight_bytes"], report["fp32_streaming_seconds"]
    text = (f"Reading the {nbytes / 2**20:.0f} MiB of float32 weights once takes {floor * 1000:.1f} ms here "
            f"({nbytes / floor / 1e9:.1f} GB/s): the floor of one float32 decoding step")
    hf = report["greedy"].get("hf-generate")
    if hf:
        per_token = 1 / hf["tokens_per_s"]
        text += (f". HF generate spends {per_token * 1000:.1f} ms per token, so a float32 engine at that floor "
                 f"would be at most {per_token / floor:.1f}x HF generate "
                 "(bfloat16 halves the bytes, int8 quarters them)")
    return [text + ".", ""]


def ratio_table(report: dict) -> list[str]:
    forward, ks = report["forward_seconds"], report["ks"]
    rows = ["| variant | T(1) ms | " + " | ".join(f"k={k}" for k in ks[1:]) + " |", "|" + "---|" * len(ks) + "---|"]
    for name, per_k in forward.items():
        cells = [name, f"{per_k[1] * 1000:.1f}"] + [f"{per_k[k] / per_k[1]:.2f}" for k in ks[1:]]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def ttft_table(report: dict) -> list[str]:
    rows = ["| configuration | start + imports s | load s | prefill + first token s | TTFT s | CPU s to first token |",
            "|---|---|---|---|---|---|"]
    for name, t in report["ttft"].items():
        rows.append(f"| {name} | {t['imports_s']:.2f} | {t['load_s']:.2f} | {t['prefill_s']:.2f} | {t['ttft_s']:.2f} "
                    f"| {t['cpu_s']:.2f} |")
    return rows


def rss_table(report: dict) -> list[str]:
    rows = ["| configuration | packing | after imports MB | + target MB | + draft MB | after generation MB | peak MB |",
            "|---|---|---|---|---|---|---|"]
    for name, r in report["rss"].items():
        rows.append(f"| {name} | {r['packing']} | {r['imports_mb']:.0f} | {r['target_mb']:.0f} | "
                    f"{r['target_draft_mb']:.0f} | {r['after_generate_mb']:.0f} | {r['peak_mb']:.0f} |")
    return rows


def target_checks(report: dict) -> list[dict]:
    """The issue's targets against what was measured (for the default configuration, and the best one)."""
    checks = []
    greedy, forward = report["greedy"], report["forward_seconds"]
    base = greedy.get("hf-generate", {}).get("tokens_per_s")
    native = [n for n in greedy if n not in ("hf", "hf-generate")]
    if base and native:
        best = max(native, key=lambda n: greedy[n]["tokens_per_s"])
        for name in dict.fromkeys(("default", best)):
            if name in greedy:
                value = greedy[name]["tokens_per_s"] / base
                checks.append({"target": f"greedy tok/s >= 3x HF generate ({name})", "measured": f"{value:.2f}x",
                               "met": value >= TARGETS["speedup"]})
    if "default" in forward and 8 in forward["default"]:
        for k, limit in ((5, TARGETS["t5"]), (8, TARGETS["t8"])):
            value = _ratio(forward, "default", k)
            checks.append({"target": f"T({k})/T(1) <= {limit} (default)", "measured": f"{value:.2f}",
                           "met": value <= limit})
    for name, t in report.get("ttft", {}).items():
        if name != "hf":
            checks.append({"target": f"TTFT warm < 5 s ({name})", "measured": f"{t['ttft_s']:.2f} s",
                           "met": t["ttft_s"] < TARGETS["ttft_s"]})
    for name, r in report.get("rss", {}).items():
        value = r["after_generate_mb"]
        checks.append({"target": f"RSS target + draft < 1.5 GB ({name})", "measured": f"{value:.0f} MB",
                       "met": value < TARGETS["rss_mb"]})
    return checks


def markdown(report: dict) -> str:
    lines = [
        "# Native engine benchmark",
        "",
        f"`python -m specdecode.native.bench {report['command']}` on {report['date']}: {report['model']}; "
        f"torch {report['torch']}, {report['threads']} threads, {report['machine']}, {report['clock']} clock. "
        f"Context {report['context']} "
        f"tokens for T(k); greedy: {report['new_tokens']} new tokens after a chat prompt, median of "
        f"{report['greedy_reps']}; T(k): median of {report['reps']}; top-1 agreement over "
        f"{report['agreement_positions']} teacher-forced positions.",
        "",
        "## Decoding speed and agreement",
        "",
        *speed_table(report),
        "",
        *floor_lines(report),
        "## Verification cost T(k)/T(1)",
        "",
        *ratio_table(report),
    ]
    if report.get("ttft"):
        lines += ["", "## Time to first token (fresh process, warm disk cache)", "", *ttft_table(report)]
    if report.get("rss"):
        lines += ["", f"## Resident memory, target + draft ({report['draft']})", "", *rss_table(report)]
    lines += ["", "## Issue targets", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {c['target']} | {c['measured']} | {'yes' if c['met'] else 'no'} |" for c in report["targets"]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and shorter runs (~2 minutes)")
    parser.add_argument("--with-compile", action="store_true", help="add the torch.compile variant (~6 min more)")
    parser.add_argument("--variants", default=None, help=f"comma-separated, from: {','.join(VARIANTS)}")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (needs --threads 1; steadier on a busy machine)")
    parser.add_argument("--draft", default="bundled",
                        help="draft for the RSS probe: bundled (default), truncated:N or a model path")
    parser.add_argument("--no-probes", action="store_true", help="skip the fresh-process TTFT and RSS measurements")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables as markdown here")
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else list(DEFAULT_VARIANTS)
    if args.with_compile and "compiled" not in names:
        names.append("compiled")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread's CPU time: it needs --threads 1")
    args.names = names
    return args


def _chat_ids(tokenizer, text: str) -> torch.Tensor:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_dict=True)
    return torch.tensor(encoded["input_ids"])


def _build_all(names: list[str], hf_model, context: torch.Tensor, max_k: int, clock: Clock) -> tuple[dict, dict]:
    builders = _builders(hf_model)
    models, timings = {}, {}
    for name in names:
        if name == "hf-generate":
            continue
        start = clock()
        models[name] = builders[name]()
        built = clock() - start
        warmed = warm_up(models[name], context, max_k, clock)
        timings[name] = {"build_s": built, "warm_up_s": warmed, **_describe(models[name])}
        print(f"{name}: built in {built:.1f} s, warm-up {timings[name]['warm_up_s']:.1f} s", flush=True)
    return models, timings


def _agreement_sequences(reference: LanguageModel, tokenizer, settings: Settings) -> list[torch.Tensor]:
    """Chat prompts followed by the reference's greedy continuation."""
    sequences = []
    for text in AGREEMENT_PROMPTS[: settings.agree_prompts]:
        prompt = _chat_ids(tokenizer, text)
        continuation = generate(reference, prompt, max_new_tokens=settings.agree_tokens, sampling=GREEDY).token_ids
        sequences.append(torch.cat([prompt, torch.tensor(continuation)]))
    return sequences


def measure_in_process(names: list[str], settings: Settings, clock: Clock) -> dict:
    """Build the variants, then time T(k) and greedy decoding and count top-1 agreement (all interleaved)."""
    loaded = load_model()
    hf_model, tokenizer = loaded.hf_model, loaded.tokenizer
    context = torch.randint(0, loaded.model.vocab_size, (settings.context,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        models, build = _build_all(names, hf_model, context, settings.max_k, clock)
        forward = time_forward(models, context, settings.max_k, settings.reps, clock)
        print("T(k) done", flush=True)
        prompt = _chat_ids(tokenizer, PROMPT)
        runners = {name: (lambda m=model: generate(m, prompt, max_new_tokens=settings.new_tokens,
                                                   sampling=GREEDY).token_ids) for name, model in models.items()}
        if "hf-generate" in names:
            runners = {"hf-generate": lambda: _hf_generate(hf_model, tokenizer, prompt, settings.new_tokens), **runners}
        greedy = time_greedy(runners, settings.greedy_reps, clock)
        print("greedy done", flush=True)
        reference = models.get("eager") or _builders(hf_model)["eager"]()
        sequences = _agreement_sequences(reference, tokenizer, settings)
        agreement = top1_agreement(models, reference, sequences)
        nbytes = weight_bytes(hf_model)
        floor = streaming_seconds(nbytes, settings.reps, clock)
    return {"forward_seconds": forward, "greedy": greedy, "top1_agreement": agreement,
            "agreement_positions": sum(len(seq) for seq in sequences), "build": build,
            "fp32_weight_bytes": nbytes, "fp32_streaming_seconds": floor}


def _machine() -> str:
    """CPU model name and core count, as far as this platform tells."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")]
        name = models[0] if models else name
    return f"{name}, {os.cpu_count()} cores"


def run(args: argparse.Namespace, command: str) -> dict:
    """Everything the bench measures, as one JSON-able report."""
    settings = QUICK if args.quick else FULL
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {
        "command": command,
        "date": datetime.date.today().isoformat(),
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized)",
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "torch": torch.__version__,
        "machine": _machine(),
        "quick": args.quick,
        "variants": list(args.names),
        "descriptions": {n: DESCRIPTIONS[n] for n in args.names},
        "context": settings.context,
        "ks": list(range(1, settings.max_k + 1)),
        "reps": settings.reps,
        "new_tokens": settings.new_tokens,
        "greedy_reps": settings.greedy_reps,
        "draft": args.draft,
        **measure_in_process(args.names, settings, CLOCKS[args.clock]),
    }
    if not args.no_probes:
        report["ttft"] = measure_ttft(settings.ttft_configs, settings.probe_runs, args.threads)
        print("TTFT done", flush=True)
        report["rss"] = measure_rss(settings.rss_configs, args.draft, args.threads)
    report["targets"] = target_checks(report)
    return report


def main(argv: list[str] | None = None) -> dict:
    import sys

    args = _parse(argv)
    command = " ".join(sys.argv[1:] if argv is None else argv)
    report = run(args, command)
    text = markdown(report)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return report


if __name__ == "__main__":
    main()
