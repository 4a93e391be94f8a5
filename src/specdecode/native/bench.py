"""Speed of the native engine against the Hugging Face adapter on the default model (SmolLM2-135M).

    python -m specdecode.native.bench [--threads 1] [--variants hf,eager,packed,dual] [--out bench.json]

Two measurements, each interleaved across variants (so a busy machine slows all alike), medians:
- T(k): one `extend` of k tokens after a context of --context tokens, k = 1..--max-k, rolled back each time;
- plain greedy decoding (no draft) of --new-tokens tokens after a chat prompt, end-to-end tokens/s,
  and whether each variant's tokens equal the HF adapter's.
Prints a markdown table; --out writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.models.base import LanguageModel
from specdecode.models.hf import HFCausalLM
from specdecode.models.loading import default_gguf_path, load_model
from specdecode.native.engine import NativeLM
from specdecode.native.loading import native_from_gguf

VARIANTS = ("hf", "eager", "packed", "dual", "bf16-packed", "bf16-dual", "compiled")
PROMPT = "Explain in a few sentences how a key-value cache speeds up text generation in transformers."


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
        "dual": _native(packing="dual"),  # NativeLM's default on CPU
        "bf16-packed": _native(torch.bfloat16, packing="packed"),
        "bf16-dual": _native(torch.bfloat16, packing="dual"),
        "compiled": _native(compile=True),
    }


def _warm_up(model: LanguageModel, context: torch.Tensor, max_k: int) -> float:
    """Run every shape once (compiles a compiled variant); return the seconds it took."""
    start = time.perf_counter()
    model.prefill(context)
    for k in range(1, max_k + 1):
        model.extend(context[:k])
        model.rollback(0)
    return time.perf_counter() - start


def time_forward(models: dict[str, LanguageModel], context: torch.Tensor, max_k: int, reps: int) -> dict:
    """Median seconds of extend(k tokens) per variant and k, after prefilling `context`."""
    for model in models.values():
        model.prefill(context)
    generator = torch.Generator().manual_seed(0)
    times: dict[str, dict[int, list[float]]] = {name: {k: [] for k in range(1, max_k + 1)} for name in models}
    names = list(models)
    for rep in range(reps):
        for k in range(1, max_k + 1):
            feed = torch.randint(0, 1000, (k,), generator=generator)
            for name in names[rep % len(names):] + names[: rep % len(names)]:  # rotate the order
                start = time.perf_counter()
                models[name].extend(feed)
                times[name][k].append(time.perf_counter() - start)
                models[name].rollback(0)
    return {name: {k: statistics.median(v) for k, v in per_k.items()} for name, per_k in times.items()}


def time_greedy(models: dict[str, LanguageModel], prompt: torch.Tensor, new_tokens: int, reps: int) -> dict:
    """Median end-to-end tokens/s of plain greedy decoding, and the tokens of each variant."""
    rates: dict[str, list[float]] = {name: [] for name in models}
    tokens: dict[str, list[int]] = {}
    for _ in range(reps):
        for name, model in models.items():
            result = generate(model, prompt, max_new_tokens=new_tokens, sampling=SamplingParams(0.0))
            rates[name].append(result.stats.tokens_per_s)
            tokens[name] = result.token_ids
    return {name: {"tokens_per_s": statistics.median(r), "token_ids": tokens[name]} for name, r in rates.items()}


def markdown(report: dict) -> str:
    forward, greedy, ks = report["forward_seconds"], report["greedy"], report["ks"]
    base = greedy.get("hf", {}).get("tokens_per_s")
    head = ["variant", "greedy tok/s", "x HF", "same tokens as HF"] + [f"T({k}) ms" for k in ks]
    head += ["T(5)/T(1)" if 5 in ks else f"T({ks[-1]})/T(1)", "warm-up s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, per_k in forward.items():
        g = greedy[name]["tokens_per_s"]
        same = greedy[name]["token_ids"] == greedy["hf"]["token_ids"] if "hf" in greedy else None
        cells = [name, f"{g:.1f}", f"{g / base:.2f}" if base else "", "" if same is None else str(same)]
        cells += [f"{per_k[k] * 1000:.1f}" for k in ks]
        kk = 5 if 5 in ks else ks[-1]
        cells += [f"{per_k[kk] / per_k[1]:.2f}", f"{report['warm_up_seconds'][name]:.1f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="hf,eager,packed,dual", help=f"comma-separated: {','.join(VARIANTS)}")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--context", type=int, default=200, help="tokens in the cache before timing extend")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=48, help="greedy decoding length")
    parser.add_argument("--greedy-reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model()
    builders = _builders(loaded.hf_model)
    context = torch.randint(0, loaded.model.vocab_size, (args.context,), generator=torch.Generator().manual_seed(1))
    models, load_seconds, warm_up = {}, {}, {}
    with torch.inference_mode():
        for name in names:
            start = time.perf_counter()
            models[name] = builders[name]()
            load_seconds[name] = time.perf_counter() - start
            warm_up[name] = _warm_up(models[name], context, args.max_k)
            print(f"{name}: built in {load_seconds[name]:.1f} s, warm-up {warm_up[name]:.1f} s", flush=True)
        forward = time_forward(models, context, args.max_k, args.reps)
    chat = [{"role": "user", "content": PROMPT}]
    encoded = loaded.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
    prompt = torch.tensor(encoded["input_ids"])
    greedy = time_greedy(models, prompt, args.new_tokens, args.greedy_reps)
    report = {
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized, float32 unless the variant says bf16)",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "context": args.context,
        "ks": list(range(1, args.max_k + 1)),
        "forward_seconds": forward,
        "greedy": greedy,
        "load_seconds": load_seconds,
        "warm_up_seconds": warm_up,
        "new_tokens": args.new_tokens,
    }
    print(markdown(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
