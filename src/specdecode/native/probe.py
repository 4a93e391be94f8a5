"""Fresh-process measurements for the bench: time to first token and resident memory (RSS).

    python -m specdecode.native.probe ttft [--backend native|hf] [--dtype float32|bfloat16] [--quantize none|int8]
    python -m specdecode.native.probe rss [--target NAME|PATH] [--draft bundled|truncated:2|NAME|PATH] [--dtype ...]

Each prints one JSON object on its last line. `bench.py` runs them in subprocesses (`run_probe`) so that
nothing is loaded or warm in memory beforehand; only the disk cache (converted model, OS page
cache) is warm, after one discarded run. --spawned-at is the parent's time.time() just before the
process was started, so TTFT includes interpreter start-up and imports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from specdecode.backends import DTYPES
from specdecode.models.loading import DEFAULT_TARGET, default_gguf_path, load_model
from specdecode.native.loading import _build, load_native, native_from_gguf
from specdecode.native.model import NativeTransformer

__all__ = ["rss_mb", "peak_rss_mb", "weight_mb", "truncated_draft", "load_draft", "run_probe", "DTYPES", "PROMPT"]

PROMPT = "Explain in a few sentences how a key-value cache speeds up text generation in transformers."
_MB = 1024 * 1024


def rss_mb() -> float:
    """Resident memory of this process now, MiB (psutil if installed, else /proc/self/status VmRSS)."""
    try:
        import psutil
    except ImportError:
        return _proc_status_kb("VmRSS") / 1024
    return psutil.Process().memory_info().rss / _MB


def peak_rss_mb() -> float:
    """The most resident memory this process has had, MiB: VmHWM where /proc exists, else ru_maxrss.

    On Linux ru_maxrss also counts the parent's peak from before exec, so /proc comes first.
    """
    if Path("/proc/self/status").is_file():
        return _proc_status_kb("VmHWM") / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


def weight_mb(*modules: torch.nn.Module) -> float:
    """MiB of the tensors the modules hold (parameters and buffers, packed copies included), each storage once."""
    storages: dict[int, int] = {}
    tensors = [tensor for module in modules for sub in module.modules()
               for tensor in (*sub._parameters.values(), *sub._buffers.values(), *vars(sub).values())
               if isinstance(tensor, torch.Tensor)]  # plain attributes too: PackedLinear.packed
    for tensor in tensors:
        if tensor.layout == torch._mkldnn:  # a oneDNN-packed weight: no storage to ask
            storages[id(tensor)] = tensor.numel() * tensor.element_size()
        else:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()) / _MB


def _proc_status_kb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def truncated_draft(num_layers: int, dtype: torch.dtype) -> NativeTransformer:
    """The default model cut to its first num_layers layers (own copy of embedding and head): a tiny draft."""
    full, _ = native_from_gguf(default_gguf_path(), dtype, with_tokenizer=False)
    if not 1 <= num_layers <= full.config.num_layers:
        raise ValueError(f"draft layers must be in [1, {full.config.num_layers}], got {num_layers}")
    config = replace(full.config, num_layers=num_layers)
    keep = {f"layers.{i}." for i in range(num_layers)}
    state = {name: t for name, t in full.state_dict().items()
             if not name.startswith("layers.") or any(name.startswith(prefix) for prefix in keep)}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return _build(config, state, dtype)


def load_draft(spec: str, target, dtype: torch.dtype, quantize: str):
    """A drafter for `target` (a LoadedModel of the default model on the native engine): 'bundled' (the shipped
    EAGLE draft, reading the target's features), 'truncated:N' (the default model's first N layers) or a path
    load_native takes (a model draft)."""
    from specdecode.drafters import ModelDrafter
    from specdecode.native.engine import NativeLM

    if spec == "bundled":  # the EAGLE draft shipped for the default model, as `specdecode generate` runs it
        from specdecode.drafters.distilled import bundled_draft_dir
        from specdecode.pipeline import eagle_drafter

        return eagle_drafter(str(bundled_draft_dir(DEFAULT_TARGET)), target)
    if spec.startswith("truncated:"):
        layers = spec.partition(":")[2]
        if not layers.isdigit():
            raise ValueError(f"draft must be 'truncated:N' with N a number of layers, or a model path; got {spec!r}")
        return ModelDrafter(NativeLM(truncated_draft(int(layers), dtype), name=spec, max_cache_len=2048, quantize=quantize))
    return ModelDrafter(load_native(spec, dtype, max_cache_len=2048, quantize=quantize).model)


def _chat_ids(tokenizer) -> torch.Tensor:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                            return_dict=True)
    return torch.tensor(encoded["input_ids"])


def ttft(args: argparse.Namespace) -> dict:
    """Load the default model, encode a chat prompt, prefill, pick the first token; times since spawn."""
    imported = time.time()
    if args.backend == "hf":
        loaded = load_model(dtype=DTYPES[args.dtype])
    else:
        loaded = load_native(dtype=DTYPES[args.dtype], quantize=args.quantize)
    ready = time.time()
    with torch.inference_mode():
        first = int(loaded.model.prefill(_chat_ids(loaded.tokenizer)).argmax())
    done = time.time()
    return {"imports_s": imported - args.spawned_at, "load_s": ready - imported, "prefill_s": done - ready,
            "ttft_s": done - args.spawned_at, "cpu_s": time.process_time(), "first_token": first}


def rss(args: argparse.Namespace) -> dict:
    """RSS after imports, after loading the target, after the draft, after a short speculative generation."""
    from specdecode.core.sampling import SamplingParams
    from specdecode.decoding import generate
    from specdecode.drafters.eagle import EagleDrafter

    out = {"imports_mb": rss_mb()}
    dtype = DTYPES[args.dtype]
    target = load_native(args.target, dtype=dtype, quantize=args.quantize)
    out["target_mb"] = rss_mb()
    drafter = load_draft(args.draft, target, dtype, args.quantize)
    out["target_draft_mb"] = rss_mb()
    out["load_peak_mb"] = peak_rss_mb()  # loading both, before any generation
    draft_model = getattr(getattr(drafter, "model", None), "model", None)  # a model draft's NativeTransformer
    out["weights_mb"] = weight_mb(target.model.model, *([draft_model] if draft_model is not None else []))
    result = generate(target.model, _chat_ids(target.tokenizer), drafter=drafter, gamma=4,
                      max_new_tokens=args.new_tokens, sampling=SamplingParams(0.0))
    if isinstance(drafter, EagleDrafter):
        draft_packing = f"eagle ({drafter.quantize})"
    else:  # a model draft, maybe inside a reduced-vocabulary wrapper
        draft_packing = getattr(drafter.model, "inner", drafter.model).packing
    out.update(after_generate_mb=rss_mb(), peak_mb=peak_rss_mb(), alpha=result.stats.alpha,
               packing=target.model.packing, draft_packing=draft_packing)
    return out


def run_probe(kind: str, *options: str, timeout: float = 300) -> dict:
    """Run `python -m specdecode.native.probe kind options...` in a fresh process; its JSON result."""
    command = [sys.executable, "-m", "specdecode.native.probe", kind, *options, "--spawned-at"]
    started = time.time()
    done = subprocess.run(command + [repr(started)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if done.returncode != 0:
        raise RuntimeError(f"probe {kind} {' '.join(options)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("ttft", "rss"))
    parser.add_argument("--backend", choices=("native", "hf"), default="native", help="ttft only")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="rss only: the target (a known model's name or a path)")
    parser.add_argument("--draft", default="bundled", help="rss only: 'bundled', 'truncated:N' or a model name or path")
    parser.add_argument("--new-tokens", type=int, default=32, help="rss only: speculative tokens generated")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--spawned-at", type=float, default=None, help="the parent's time.time() at spawn")
    args = parser.parse_args(argv)
    if args.spawned_at is None:
        args.spawned_at = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = ttft(args) if args.kind == "ttft" else rss(args)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
