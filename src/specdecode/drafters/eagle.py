"""The EAGLE drafter: an `EagleNetwork` reading the target's own features, and its draft directory.

Where it stands in a step: the target has run over prompt + generated[:-1] (n - 1 positions, their
final-norm features f kept by `NativeLM.keep_features`). The drafter feeds the positions its own
cache lacks with the target's f (one batched step), then drafts token by token, each step reading
the g it computed before. Its speculative positions are overwritten by the next proposal, which
starts again from the target's features: rolling back is moving an integer.

A draft directory (`specdecode distill --eagle`) is a distilled-draft directory whose
draft_config.json says "kind": "eagle"; model.safetensors holds the network (bfloat16) and output_ids.
It has no token embedding: it uses its target's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from specdecode.core.sampling import SamplingParams, probabilities, sample
from specdecode.drafters.base import Draft, check_min_confidence, unsure
from specdecode.drafters.distilled import CONFIG_FILE, read_draft_config, read_draft_weights, write_draft_directory
from specdecode.native.config import NativeConfig
from specdecode.native.eagle import EagleNetwork
from specdecode.native.model import skipped_initialization

__all__ = ["EAGLE_KIND", "FeatureModel", "EagleDrafter", "keeps_features", "save_eagle", "load_eagle", "is_eagle_draft"]

EAGLE_KIND = "eagle"


@runtime_checkable
class FeatureModel(Protocol):
    """A target an EAGLE draft can read: a `LanguageModel` that keeps each position's final-norm output
    (`NativeLM`, `LlamaCppLM`)."""

    config: object  # hidden_size, vocab_size
    device: torch.device
    max_length: int
    vocab_size: int

    def keep_features(self) -> None: ...

    def features(self, start: int, end: int) -> torch.Tensor: ...  # [end - start, hidden]

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor: ...  # [n, hidden]


def keeps_features(model) -> bool:
    """Whether an EAGLE draft can read this model's features."""
    return isinstance(model, FeatureModel)


class EagleDrafter:
    """Samples gamma tokens from an EagleNetwork on `target`'s features and returns the q they came from.

    target: the model being decoded (a `FeatureModel`: the native or llama.cpp engine); from construction on it
    keeps each position's features.
    output_ids [K]: the target token of each head row (q is exactly zero for every other token).
    quantize: 'int8' runs the network on int8 weights (`EagleNetwork.quantize_int8`, in place): a cheaper
    step and a slightly different q, which is still exactly the q it samples from.
    min_confidence: the draft stops early, before gamma tokens, after a token its own q gave less than this
    (`drafters.base.unsure`; EAGLE-2's confidence). 0 always drafts gamma.
    """

    def __init__(self, network: EagleNetwork, output_ids: torch.Tensor, target: FeatureModel, name: str = "eagle",
                 quantize: str = "none", min_confidence: float = 0.0) -> None:
        if not keeps_features(target):
            raise TypeError(f"an EAGLE draft reads its target's features: the target must run on the native or the "
                            f"llama.cpp engine, got {type(target).__name__}")
        config, target_config = network.config, target.config
        if (config.hidden_size, config.vocab_size) != (target_config.hidden_size, target_config.vocab_size):
            raise ValueError(f"EAGLE draft {name}: built for hidden size {config.hidden_size} and vocabulary "
                             f"{config.vocab_size}, the target has {target_config.hidden_size} and {target_config.vocab_size}")
        if output_ids.shape != (network.output_vocab_size,):
            raise ValueError(f"output_ids must have shape [{network.output_vocab_size}], got {tuple(output_ids.shape)}")
        if quantize not in ("none", "int8"):
            raise ValueError(f"quantize must be 'none' or 'int8', got {quantize!r}")
        check_min_confidence(min_confidence)
        target.keep_features()
        self.network = network.eval().requires_grad_(False)
        if quantize == "int8":
            network.quantize_int8()
        self.quantize = quantize
        self.min_confidence = float(min_confidence)
        self.output_ids = output_ids.long()
        self.target = target
        self.name = f"eagle:{name}"
        self._embed = target.embed_tokens  # the target's token embedding
        self._cache = network.new_cache(target.max_length)
        self._prompt = torch.zeros(0, dtype=torch.long)
        self._tokens = torch.zeros(0, dtype=torch.long)  # the tokens of the cache slots computed from f
        self._started = False

    def on_target(self, target: FeatureModel) -> "EagleDrafter":
        """A drafter with this one's network (its weights and quantization, shared) on another target: each sequence
        of a batch drafts from its own features with a cache of its own."""
        if (target.config.hidden_size, target.vocab_size) != (self.target.config.hidden_size, self.target.vocab_size):
            raise ValueError(f"{self.name}: the new target's hidden size or vocabulary differs from the draft's")
        other = copy.copy(self)
        target.keep_features()
        other.target, other._embed = target, target.embed_tokens
        other._cache = self.network.new_cache(target.max_length)
        other._prompt = other._tokens = torch.zeros(0, dtype=torch.long)
        other._started = False
        return other

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)
        self._tokens = self._prompt[:0]
        self._started = True

    @torch.inference_mode()
    def propose(
        self, generated: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        if not self._started:
            raise RuntimeError("call start() before propose()")
        tokens = torch.cat([self._prompt, generated.long()])  # [n]; the target has features of 0 .. n - 2
        n = tokens.numel()
        gamma = min(gamma, self._cache.max_len - n + 1)  # draft positions n .. n + gamma - 2 must fit
        if gamma < 1:
            return Draft.empty()
        g = self._catch_up(tokens)[-1:]  # [1, H] at position n - 1
        drafted: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(gamma):
            logits = self.network.head(g)[0].float()  # [K]
            q_head = None
            if sampling.greedy:
                row = int(logits.argmax())  # the argmax of the widened q
            else:  # q over the K head tokens, then widened with zeros: the same q as over V with -inf logits
                q_head = probabilities(logits, sampling)  # [K]
                row = int(sample(q_head, generator))
                probs.append(widen_probabilities(q_head, self.output_ids, self.target.vocab_size))
            token = int(self.output_ids[row])
            drafted.append(token)
            if i + 1 == gamma or unsure(logits, q_head, row, self.min_confidence):
                break
            # its own g stands in for the feature the target has not computed
            g = self.network.step(g, self._embed(torch.tensor([token])), n + i, self._cache)
        token_tensor = torch.tensor(drafted, dtype=torch.long)
        return Draft(token_tensor) if sampling.greedy else Draft(token_tensor, torch.stack(probs))

    def _catch_up(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed the cache the positions it lacks up to n - 1, from the target's features; g of those [m, H]."""
        n = tokens.numel()
        known = min(self._tokens.numel(), n - 1)  # keep the last position: its g starts the draft
        differs = (self._tokens[:known] != tokens[:known]).nonzero()
        start = int(differs[0]) if len(differs) else known
        features = self.target.features(max(start - 1, 0), n - 1)  # f_{start-1} .. f_{n-2}
        if start == 0:  # f_{-1} is zero
            features = torch.cat([features.new_zeros(1, features.shape[1]), features])
        self._tokens = tokens
        return self.network.step(features, self._embed(tokens[start:]), start, self._cache)

    def observe(self, draft: Draft, num_accepted: int) -> None:
        """Nothing to do: the next proposal overwrites the speculative positions from the target's features."""


def widen_probabilities(q: torch.Tensor, output_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q [K] over the tokens output_ids as q [vocab_size], zero for every other token.

    Equal to probabilities(widen_logits(...)): temperature, top-k and top-p never give a -inf logit mass.
    """
    full = q.new_zeros(vocab_size)
    full[output_ids] = q
    return full


def is_eagle_draft(path: str | Path) -> bool:
    config_path = Path(path) / CONFIG_FILE
    return config_path.is_file() and read_draft_config(Path(path)).get("kind") == EAGLE_KIND


def save_eagle(directory: Path, network: EagleNetwork, output_ids: torch.Tensor, target: str, tokenizer, report: dict) -> None:
    """Write an EAGLE draft directory (config, bfloat16 weights with output_ids, tokenizer); the model card is separate."""
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in network.state_dict().items()}
    write_draft_directory(directory, state, output_ids, network.config, target, tokenizer, report, kind=EAGLE_KIND)


def load_eagle(directory: str | Path, dtype: torch.dtype = torch.float32) -> tuple[EagleNetwork, torch.Tensor, dict]:
    """The network of an EAGLE draft directory, its output_ids [K] and its draft_config.json contents."""
    directory = Path(directory)
    config = read_draft_config(directory)
    if config.get("kind") != EAGLE_KIND:
        raise ValueError(f"{directory} is not an EAGLE draft (kind={config.get('kind')!r})")
    state, output_ids = read_draft_weights(directory, "EAGLE draft")
    with torch.device("meta"), skipped_initialization():
        network = EagleNetwork(NativeConfig.from_dict(config["native_config"]), output_ids.numel(), dtype)
    missing = set(network.state_dict()) - set(state)
    if missing:
        raise ValueError(f"EAGLE draft {directory} lacks tensors {sorted(missing)[:5]}")
    network.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True)
    network.rope_cos = torch.zeros(0, 1, network.config.head_dim, dtype=dtype)  # off the meta device
    network.rope_sin = torch.zeros(0, 1, network.config.head_dim, dtype=dtype)
    return network.eval().requires_grad_(False), output_ids, config
