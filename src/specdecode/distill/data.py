"""Build the distillation data set in a work directory: prompts -> target responses -> target distributions.

The parameters are recorded in workdir/data.json; a later run with the same parameters resumes
where the last one stopped, and one with other parameters is refused (its shards would not match).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specdecode.distill.sources import builtin_prompts, builtin_texts, german_prompts, read_prompt_file, read_text_file
from specdecode.distill.teacher import cache_text, generate_responses, native_teacher

__all__ = ["DataConfig", "build_data"]


@dataclass(frozen=True)
class DataConfig:
    """What the target is asked and how much of it is kept."""

    prompts_per_category: int = 64
    prompt_file: str | None = None  # .jsonl prompts instead of the built-in ones
    german_file: str | None = None  # German text (a fortune file or blank-line separated entries) ...
    german_prompts: int = 0  # ... for this many German-to-English translation prompts, after the others
    max_new_tokens: int = 128
    max_prompt_tokens: int = 256
    sample_fraction: float = 0.5  # share of response batches sampled at temperature 1 (the rest greedy)
    text_documents: int = 600  # natural-text documents (XSum articles), teacher-forced
    text_file: str | None = None  # extra user text (.jsonl with "text", or blank-line separated)
    max_text_tokens: int = 384
    top_k: int = 32  # target log-probabilities kept per position
    batch_size: int = 48
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompts_per_category", "max_new_tokens", "max_prompt_tokens", "max_text_tokens", "top_k", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.german_prompts < 0:
            raise ValueError(f"german_prompts must be >= 0, got {self.german_prompts}")
        if bool(self.german_file) != bool(self.german_prompts):
            raise ValueError("german_file and german_prompts go together: a German text file and how many prompts to draw from it")
        if self.text_documents < 0:
            raise ValueError(f"text_documents must be >= 0, got {self.text_documents}")
        if not 0.0 <= self.sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction must be in [0, 1], got {self.sample_fraction}")


def build_data(hf_model, tokenizer, workdir: Path, config: DataConfig, target_source: str, features: bool = False) -> None:
    """Fill workdir with response and text shards for `config` (resumable), made on the native engine where the
    target runs there (`teacher.native_teacher`); with features, holding the target's final-norm outputs too
    (an EAGLE draft's input)."""
    vocab_size = hf_model.config.vocab_size
    if config.top_k > vocab_size:
        raise ValueError(f"top_k must be at most the target's vocabulary ({vocab_size}), got {config.top_k}")
    # every input is read before anything is written or run, so a bad file fails at once, not after hours of responses
    if config.prompt_file:
        prompts = read_prompt_file(Path(config.prompt_file))
    else:
        prompts = builtin_prompts(config.prompts_per_category, config.seed)
    german = german_prompts(Path(config.german_file), config.german_prompts, config.seed) if config.german_file else []
    texts = builtin_texts(config.text_documents, config.seed) if config.text_documents else []
    if config.text_file:
        texts += read_text_file(Path(config.text_file))
    native = native_teacher(hf_model)
    if features and native is None:
        raise ValueError(f"features: {hf_model.config.model_type} does not run on the native engine, which gives "
                         "the target's features (an EAGLE draft needs a Llama, Qwen2 or Mistral target)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    manifest = workdir / "data.json"
    wanted = {"target": target_source, **asdict(config)}
    if manifest.is_file():
        recorded = json.loads(manifest.read_text())
        if recorded != wanted:
            changed = sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))
            raise ValueError(f"{workdir} holds data built with other settings ({', '.join(changed)}); use another --out")
    else:
        manifest.write_text(json.dumps(wanted, indent=2) + "\n")
    settings = dict(max_new_tokens=config.max_new_tokens, batch_size=config.batch_size, top_k=config.top_k,
                    sample_fraction=config.sample_fraction, max_prompt_tokens=config.max_prompt_tokens, native=native,
                    features=features)
    generate_responses(hf_model, tokenizer, prompts, workdir, seed=config.seed, **settings)
    if german:  # their own shard series and seeds: they stay as they are when prompts_per_category grows
        generate_responses(hf_model, tokenizer, german, workdir, seed=config.seed + 1, series="german", **settings)
    if texts:
        cache_text(hf_model, tokenizer, texts, workdir, top_k=config.top_k, max_tokens=config.max_text_tokens,
                   native=native, features=features)
