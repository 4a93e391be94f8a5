"""Hugging Face `generate` as peers: plain, prompt lookup (`prompt_lookup_num_tokens`) and assisted
generation (`assistant_model`), on the same target weights and prompts.

Each peer is compared with plain `generate` (the same engine). Settings match specdecode's where
HF allows: gamma draft tokens per call, a constant schedule and no confidence cut-off for the
assistant, 3-gram matching for prompt lookup, pure sampling (top_k=0, top_p=1) at temperature > 0.
A peer that cannot run a configuration is returned as unavailable with the reason.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import torch

from specdecode import backends
from specdecode.bench.measure import Method, Output, timed

__all__ = ["Unavailable", "is_hf_model", "hf_method", "hf_peers", "load_assistant"]


@dataclass
class Unavailable:
    method: str
    reason: str

    def to_dict(self) -> dict:
        return {"method": self.method, "reason": f"not applicable: {self.reason}"}


def is_hf_model(model) -> bool:
    """Whether model is a transformers model with `generate` (the native engine's hf_model is not)."""
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel) and hasattr(model, "generate")


def hf_method(
    label: str,
    family: str,
    model,
    encoded: Sequence[torch.Tensor],
    max_new_tokens: int,
    eos_token_ids: Collection[int],
    gamma: int | None = None,
    **extra,
) -> Method:
    """A Method running model.generate(prompt, **extra) with specdecode's sampling conventions."""
    eos = sorted(eos_token_ids)
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))

    def generate(prompt: int, temperature: float, seed: int, limit: int | None = None) -> Output:
        ids = encoded[prompt][None]  # [1, P]
        config = copy.deepcopy(model.generation_config)
        settings = dict(max_new_tokens=limit or max_new_tokens, do_sample=temperature > 0, num_beams=1,
                        eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
        if temperature > 0:
            settings.update(temperature=temperature, top_k=0, top_p=1.0)
        else:
            settings.update(temperature=None, top_k=None, top_p=None)
        config.update(**settings, **{k: v for k, v in extra.items() if k != "assistant_model"})
        models = {k: v for k, v in extra.items() if k == "assistant_model"}

        def run():
            torch.manual_seed(seed)
            with _quiet_transformers():  # assisted generation warns about its own internal generate call
                out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **models)
            new = out[0, 1:] if encoder_decoder else out[0, ids.shape[1]:]  # drop the decoder start / the prompt
            return new.tolist(), None, None

        return timed(run)

    return Method(label, "hf", family, label, gamma, generate)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_assistant(spec: str, target_model) -> tuple[object | None, str | None]:
    """(an HF draft model for assisted generation, None) or (None, why it cannot be one)."""
    from specdecode.drafters.distilled import is_distilled_draft
    from specdecode.pipeline import resolve_draft_name

    model_spec = resolve_draft_name(spec).removesuffix("+ngram")
    if model_spec == "bundled" or is_distilled_draft(model_spec):
        return None, (f"draft {spec!r} is a specdecode distilled draft (native engine only, reduced output "
                      "vocabulary); assisted generation needs a transformers model")
    try:
        loaded = backends.load(model_spec, "hf")
    except Exception as error:  # noqa: BLE001 - any failure makes the peer not applicable, with its reason
        return None, f"draft {spec!r} does not load as a Hugging Face model ({error})"
    draft = loaded.hf_model
    if not is_hf_model(draft):
        return None, f"draft {spec!r} is not a Hugging Face model"
    target_vocab = target_model.get_output_embeddings().weight.shape[0]
    draft_vocab = draft.get_output_embeddings().weight.shape[0]
    if draft_vocab != target_vocab:
        return None, f"draft {spec!r} has {draft_vocab} output ids, the target {target_vocab} (a reduced output vocabulary)"
    return draft, None


def hf_peers(
    target_model,
    peers: Collection[str],
    model_drafts: Sequence[str],
    other_drafts: Sequence[str],
    gamma: int,
    encoded: Sequence[torch.Tensor],
    max_new_tokens: int,
    eos_token_ids: Collection[int],
) -> tuple[Method, list[Method], list[Unavailable]]:
    """(HF plain generate, the peers that can run, the peers that cannot and why)."""
    common = dict(encoded=encoded, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)
    plain = hf_method("HF generate", "baseline", target_model, **common)
    methods: list[Method] = []
    unavailable: list[Unavailable] = []
    if "prompt-lookup" in peers:
        methods.append(hf_method(f"HF prompt lookup γ={gamma}", "peer", target_model, gamma=gamma,
                                 prompt_lookup_num_tokens=gamma, max_matching_ngram_size=3, **common))
    if "assisted" in peers:
        if not model_drafts:
            unavailable.append(Unavailable(
                "HF assisted generation",
                f"no model draft among the drafts ({', '.join(other_drafts)}); assisted generation needs one",
            ))
        for spec in model_drafts:
            label = f"HF assisted ({spec}) γ={gamma}"
            draft, reason = load_assistant(spec, target_model)
            if draft is None:
                unavailable.append(Unavailable(label, reason))
                continue
            draft.generation_config.num_assistant_tokens = gamma
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            methods.append(hf_method(label, "peer", target_model, gamma=gamma, assistant_model=draft, **common))
    return plain, methods, unavailable
