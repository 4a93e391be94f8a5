"""`specdecode distill`: target -> data -> draft, end to end, resumable, reproducible from a seed.

    work directory (--out)
      data.json, responses-*.safetensors, text-*.safetensors   the target's data (specdecode.distill.data);
                         with --eagle they also hold its final-norm features, from the passes that made the data
      features.safetensors  with --eagle: the features of sequences whose shards have none (older work directories)
      init.pt            the draft's initial weights and output vocabulary
      checkpoint.pt      training state, every --checkpoint-every steps
      draft/             the finished draft (load it with --draft PATH), with its model card
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from specdecode.distill.data import DataConfig, build_data
from specdecode.distill.teacher import TeacherData, load_teacher, shard_seconds
from specdecode.distill.card import model_card
from specdecode.distill.eagle import EagleObjective, eagle_from_draft, init_eagle, target_features
from specdecode.distill.train import TrainConfig, evaluate, train, trained_seconds
from specdecode.drafters.distilled import build_draft_transformer, read_draft_config, save_draft
from specdecode.drafters.eagle import save_eagle
from specdecode.native.eagle import EagleNetwork
from specdecode.native.config import NativeConfig
from specdecode.native.loading import end_of_sequence_ids, native_from_hf_model
from specdecode.native.model import NativeTransformer
from specdecode.native.quant import Int8Embedding, quantize_per_channel

__all__ = ["DraftArchitecture", "distill", "choose_output_ids", "held_out_indices", "init_draft", "weight_count"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftArchitecture:
    """The draft's shape. output_vocab=0 keeps the target's whole vocabulary in the head."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 4
    intermediate: int = 768
    output_vocab: int = 8192
    init_from_target: bool = True  # embeddings and head from a PCA of the target's token embeddings
    # copies of these target decoder layers instead of a fresh stack: the draft then has the target's
    # shape (the fields above except output_vocab are not used), its embeddings (int8, not trained), final norm and head rows
    target_layers: tuple[int, ...] = ()
    # an EAGLE draft (specdecode.native.eagle): one decoder layer of the target's shape reading the target's
    # features, with the target's embeddings and head rows (the fields above except output_vocab are not used)
    eagle: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layers", tuple(self.target_layers))  # a list from JSON or the CLI
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.target_layers) or list(
            self.target_layers
        ) != sorted(set(self.target_layers)):
            raise ValueError(f"target_layers must be increasing layer indices >= 0, got {list(self.target_layers)}")
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden ({self.hidden}) must split into heads ({self.heads}) of even size")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.eagle and self.target_layers:
            raise ValueError("eagle and target_layers are two kinds of draft; choose one")
        if self.output_vocab < 0:
            raise ValueError(f"output_vocab must be >= 0 (0 = the whole vocabulary), got {self.output_vocab}")

    def native_config(self, target_config) -> NativeConfig:
        """The draft's NativeConfig: this shape, with the target's vocabulary, RoPE base, context and special tokens.

        With target_layers: the target's own config, cut to those layers, with an untied head.
        """
        if self.target_layers:
            config = NativeConfig.from_hf_config(target_config)
            if self.target_layers[-1] >= config.num_layers:
                raise ValueError(f"target_layers {list(self.target_layers)}: the target has {config.num_layers} layers")
            return dataclasses.replace(config, num_layers=len(self.target_layers), tie_word_embeddings=False)
        rope = dict(getattr(target_config, "rope_parameters", None) or {})
        return NativeConfig(
            vocab_size=target_config.vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_layers=self.layers,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads,
            head_dim=self.hidden // self.heads,
            rope_theta=float(rope.get("rope_theta") or getattr(target_config, "rope_theta", None) or 10000.0),
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=getattr(target_config, "max_position_embeddings", None) or 4096,
            bos_token_id=getattr(target_config, "bos_token_id", None),
            eos_token_id=getattr(target_config, "eos_token_id", None),
            architecture="llama",
        )


def held_out_indices(categories: Sequence[str], fraction: float, seed: int) -> list[int]:
    """Indices of the held-out sequences, sorted: the same share of each category."""
    rng = random.Random(seed)
    held: list[int] = []
    for category in sorted(set(categories)):
        members = [i for i, c in enumerate(categories) if c == category]
        held += rng.sample(members, round(fraction * len(members)))
    return sorted(held)


def report_split(workdir: Path, data: TeacherData) -> tuple[list[int], list[int]]:
    """(held-out, training) indices of workdir's data as its `specdecode distill` run split them: with its seed
    (data.json) and held-out share (report.json; 0.08, the default, where a report does not record it)."""
    seed = json.loads((Path(workdir) / "data.json").read_text())["seed"]
    report_file = Path(workdir) / "report.json"
    report = json.loads(report_file.read_text()) if report_file.is_file() else {}
    held = held_out_indices(data.categories, report.get("held_out_fraction", 0.08), seed)
    if "held_out_sequences" in report and len(held) != report["held_out_sequences"]:
        raise ValueError(f"{workdir}: this split holds out {len(held)} sequences, its report {report['held_out_sequences']} "
                         "(its data or held-out share changed since)")
    return held, sorted(set(range(len(data))) - set(held))


def choose_output_ids(data: TeacherData, size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The `size` token ids with the most target probability mass in data (plus `always`, e.g. EOS), sorted."""
    if size == 0 or size >= vocab_size:
        return torch.arange(vocab_size)
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for ids, logp in zip(data.topk_ids, data.topk_logp):
        mass.index_add_(0, ids.reshape(-1), logp.exp().reshape(-1).double())
    mass[torch.tensor(always, dtype=torch.long)] = float("inf")
    return mass.topk(size).indices.sort().values


def init_draft(architecture: DraftArchitecture, target_config, target_embedding: torch.Tensor | None,
               output_ids: torch.Tensor, seed: int, target: NativeTransformer | None = None) -> NativeTransformer:
    """A fresh draft; with init_from_target its embeddings (and head rows) are the target's projected by PCA.

    With architecture.target_layers it is cut from `target` (the target on the native engine) instead.
    """
    torch.manual_seed(seed)
    model = build_draft_transformer(architecture.native_config(target_config), output_ids.numel())
    if architecture.target_layers:
        if target is None:
            raise ValueError("target_layers needs the target's weights (target=)")
        return _cut_from_target(model, target, architecture.target_layers, output_ids)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)
        if architecture.init_from_target:
            if target_embedding is None:
                raise ValueError("init_from_target needs the target's token embeddings")
            centred = target_embedding.float() - target_embedding.float().mean(dim=0)
            _, _, vh = torch.linalg.svd(centred, full_matrices=False)  # principal directions [hidden_t, hidden_t]
            projected = centred @ vh[: architecture.hidden].T  # [V, hidden]
            projected = projected / projected.std()  # unit scale; the input RMSNorm makes it irrelevant there
            model.embed.weight.copy_(projected * 0.2)
            model.lm_head.weight.copy_(projected[output_ids] * 0.02)  # the head starts near uniform
    return model


def _cut_from_target(model: NativeTransformer, target: NativeTransformer, layers: tuple[int, ...],
                     output_ids: torch.Tensor) -> NativeTransformer:
    """Copy the target's embeddings, the chosen decoder layers, its final norm and the head rows of output_ids.

    The embedding becomes an `Int8Embedding` (int8 rows, one scale each): buffers, so training leaves it as
    it is, and the saved draft stores and runs exactly that table at a quarter of float32's memory.
    """
    with torch.no_grad():
        model.embed = Int8Embedding(*quantize_per_channel(target.embed.weight), model.dtype)
        for draft_layer, index in zip(model.layers, layers):
            draft_layer.load_state_dict(target.layers[index].state_dict())
        model.norm.weight.copy_(target.norm.weight)
        model.lm_head.weight.copy_(target.lm_head.weight[output_ids])
    return model


def weight_count(model: torch.nn.Module) -> int:
    """The draft's weights: its parameters, an `Int8Embedding`'s table and an EAGLE network's head rows (buffers)."""
    if isinstance(model, EagleNetwork):
        return sum(p.numel() for p in model.parameters()) + model.head_weight.numel()
    table = model.embed.qweight.numel() if isinstance(model.embed, Int8Embedding) else 0
    return sum(p.numel() for p in model.parameters()) + table


def _check_resumed(init: dict, init_path: Path, architecture: DraftArchitecture) -> None:
    """Refuse to resume from an init.pt written with other draft settings (one written by an older specdecode
    does not record them: the checks of its kind and shapes still apply)."""
    recorded, wanted = init.get("architecture"), asdict(architecture)
    if recorded is not None and recorded != wanted:
        changed = sorted(k for k in wanted if recorded.get(k) != wanted[k])
        raise ValueError(f"{init_path} was written with other draft settings ({', '.join(changed)}); use another --out")


def _start_eagle(loaded, out: Path, data: TeacherData, train_indices: list[int],
                 choose_output: Callable[[], torch.Tensor], config: TrainConfig, architecture: DraftArchitecture,
                 continue_from: Path | None = None):
    """An EAGLE network (from out/init.pt when resuming), its output_ids, the training objective (its depth set per
    epoch by the caller), and logits_on: logits_on(indices into data, d) gives the logits_fn `evaluate` takes for
    data.subset(indices) at draft depth d.

    choose_output() gives the head's token ids of a fresh start; a resumed one reads them from init.pt. With
    continue_from (an EAGLE draft directory for this target) training starts from its weights and head instead.

    Reads (or first computes) the target's features of every sequence, and keeps the target's embedding table.
    config gives the network's seed and the objective's tv_weight and feature_weight (`EagleObjective`);
    architecture is recorded in init.pt, and a resumed run must match it.
    """
    target = native_from_hf_model(loaded.hf_model, torch.float32)
    init_path = out / "init.pt"
    started_from = None if continue_from is None else str(continue_from)
    if init_path.is_file():  # resuming: the same start, whatever the RNG did since
        init = torch.load(init_path, weights_only=True)
        if init.get("kind") != "eagle":
            raise ValueError(f"{init_path} was written for another kind of draft; use another --out or drop --eagle")
        if init.get("continue_from") != started_from:
            raise ValueError(f"{init_path} starts from {init.get('continue_from') or 'a fresh network'}, not from "
                             f"{started_from or 'a fresh network'}; use another --out")
        _check_resumed(init, init_path, architecture)
        output_ids = init["output_ids"]
        network = init_eagle(target, output_ids, config.seed)
        network.load_state_dict(init["model"])
    else:
        if continue_from is None:
            output_ids = choose_output()
            network = init_eagle(target, output_ids, config.seed)
        else:
            network, output_ids = eagle_from_draft(continue_from, target)
        torch.save({"model": network.state_dict(), "output_ids": output_ids, "kind": "eagle",
                    "continue_from": started_from, "architecture": asdict(architecture)}, init_path)
    features = target_features(target, data, out)
    embedding = target.embed.weight.detach()
    training = EagleObjective(network, embedding, [features[i] for i in train_indices],
                              feature_weight=config.feature_weight, tv_weight=config.tv_weight)

    def logits_on(indices: Sequence[int], depth: int = 1):
        return partial(EagleObjective(network, embedding, [features[i] for i in indices]).scored_logits, depth=depth)

    return network, output_ids, training, logits_on


def _starting_point(directory: Path) -> dict:
    """What a draft trained further started from: its directory, training command, held-out alpha and own start."""
    report = read_draft_config(directory).get("report", {})
    return {"directory": str(directory), "command": report.get("command"),
            "held_out": report.get("held_out", {}).get("all"), "continue_from": report.get("continue_from")}


def distill(
    target: str,
    out: Path,
    data_config: DataConfig = DataConfig(),
    architecture: DraftArchitecture = DraftArchitecture(),
    train_config: TrainConfig = TrainConfig(),
    held_out: float = 0.08,
    command: str | None = None,
    continue_from: str | Path | None = None,
) -> dict:
    """Build the data, train the draft, evaluate it on held-out sequences, save it to out/draft. Returns the report.

    continue_from: an EAGLE draft directory for this target (architecture.eagle) to train further instead of a
    fresh network; it keeps that draft's head (architecture.output_vocab is not used).
    """
    from specdecode.models.loading import load_model

    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be in (0, 1), got {held_out}")
    if train_config.depth > 1 and not architecture.eagle:
        raise ValueError(f"depth={train_config.depth} trains an EAGLE draft's deeper positions; it needs eagle=True")
    if train_config.feature_weight != TrainConfig().feature_weight and not architecture.eagle:
        raise ValueError(f"feature_weight={train_config.feature_weight} weighs an EAGLE draft's feature loss; it needs eagle=True")
    if continue_from is not None and not architecture.eagle:
        raise ValueError("continue_from trains an EAGLE draft further; it needs eagle=True")
    continue_from = None if continue_from is None else Path(continue_from)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    loaded = load_model(target)  # transformers: batched generate for the data
    if loaded.tokenizer is None:
        raise ValueError(f"target: {target} has no tokenizer; distillation needs text prompts")
    if loaded.hf_model.config.is_encoder_decoder:
        raise ValueError(f"target: {target} is an encoder-decoder model; distill supports decoder-only targets")
    tokenizer, hf_config, vocab_size = loaded.tokenizer, loaded.hf_model.config, loaded.model.vocab_size
    build_data(loaded.hf_model, tokenizer, out, data_config, loaded.source, features=architecture.eagle)
    data_seconds = time.perf_counter() - started

    data = load_teacher(out)
    held = held_out_indices(data.categories, held_out, data_config.seed)
    train_indices = sorted(set(range(len(data))) - set(held))
    if not held or not train_indices:
        raise ValueError(f"held_out: {held_out} of the {len(data)} sequences holds out {len(held)} and leaves "
                         f"{len(train_indices)} to train on; both need some (more prompts or texts, or another held_out)")
    train_data = data.subset(train_indices)
    eos = sorted(end_of_sequence_ids(loaded.hf_model, tokenizer))
    init_path = out / "init.pt"
    train_loss = logits_on = on_epoch = None  # a transformer draft reads token ids only
    features_started = time.perf_counter()
    if architecture.eagle:
        model, output_ids, objective, logits_on = _start_eagle(
            loaded, out, data, train_indices,
            lambda: choose_output_ids(train_data, architecture.output_vocab, vocab_size, eos), train_config,
            architecture, continue_from,
        )
        train_loss = objective.loss

        def on_epoch(epoch: int) -> None:
            objective.depth = train_config.depth_in_epoch(epoch)
        features_seconds = time.perf_counter() - features_started  # mostly the target's features
    elif init_path.is_file():  # resuming: the same start, whatever the RNG did since
        init = torch.load(init_path, weights_only=True)
        if init.get("kind", "transformer") != "transformer":
            raise ValueError(f"{init_path} was written for an EAGLE draft; use another --out or add --eagle")
        _check_resumed(init, init_path, architecture)
        output_ids = init["output_ids"]
        int8_embedding = "embed.qweight" in init["model"]  # a draft cut from the target
        if int8_embedding != bool(architecture.target_layers):
            raise ValueError(f"{init_path} does not match target_layers={list(architecture.target_layers)} "
                             "(written with other settings or by an older specdecode); use another --out")
        model = build_draft_transformer(architecture.native_config(hf_config), output_ids.numel(), int8_embedding=int8_embedding)
        model.load_state_dict(init["model"])
    else:
        output_ids = choose_output_ids(train_data, architecture.output_vocab, vocab_size, eos)
        embedding = loaded.hf_model.get_input_embeddings().weight.detach()
        native_target = native_from_hf_model(loaded.hf_model, torch.float32) if architecture.target_layers else None
        model = init_draft(architecture, hf_config, embedding, output_ids, train_config.seed, native_target)
        del native_target
        torch.save({"model": model.state_dict(), "output_ids": output_ids, "architecture": asdict(architecture)}, init_path)
    del loaded  # the target is not needed any more

    output_index = torch.full((vocab_size,), -1, dtype=torch.long)
    output_index[output_ids] = torch.arange(output_ids.numel())
    train_started = time.perf_counter()
    train(model, train_data, output_index, train_config, out, loss_fn=train_loss, on_epoch=on_epoch)
    train_seconds = time.perf_counter() - train_started
    # the time of the work kept in `out` over every run that did some (None: an older specdecode's, not recorded)
    whole = {"data_seconds": shard_seconds(out), "train_seconds": trained_seconds(out)}
    # as many training sequences as held out: how far the held-out alpha is from what training fits
    sample = sorted(random.Random(data_config.seed).sample(train_indices, min(len(held), len(train_indices))))

    if continue_from is not None:  # a draft trained further keeps its starting point's head, whatever output_vocab said
        architecture = dataclasses.replace(architecture, output_vocab=int(output_ids.numel()))

    def score(indices: list[int], depth: int = 1) -> dict:
        logits_fn = None if logits_on is None else logits_on(indices, depth)
        return evaluate(model, data.subset(indices), output_index, train_config.batch_tokens, logits_fn)

    report = {
        "target": target,
        "command": command or f"specdecode distill --target {target} --out DIR",
        "held_out": score(held),
        "train_sample": score(sample)["all"],
        "train_sequences": len(train_data),
        "train_positions": train_data.num_positions(),
        "held_out_sequences": len(held),
        "held_out_fraction": held_out,
        "continue_from": None if continue_from is None else _starting_point(continue_from),
        "parameters": weight_count(model),
        "data_seconds": round(whole["data_seconds"] if whole["data_seconds"] is not None else data_seconds, 1),
        "train_seconds": round(whole["train_seconds"] if whole["train_seconds"] is not None else train_seconds, 1),
        "timed": {name: "all runs" if seconds is not None else "this run" for name, seconds in whole.items()},
        "data": asdict(data_config),
        "architecture": asdict(architecture),
        "training": asdict(train_config),
    }
    if architecture.eagle:
        report["features_seconds"] = round(features_seconds, 1)
        # alpha at the second and third draft token, the tokens before them the sequence's own (evaluate's all)
        report["held_out_depths"] = {str(d): score(held, d)["all"] for d in (2, 3)}
    save = save_eagle if architecture.eagle else save_draft
    save(out / "draft", model, output_ids, target, tokenizer, report)
    (out / "draft" / "README.md").write_text(model_card(report))
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report

