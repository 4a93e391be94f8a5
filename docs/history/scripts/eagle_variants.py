"""Experiments on the EAGLE draft's design, each trained against the plain network on the same data.

Both train, on a finished `specdecode distill --eagle` work directory's data (its held-out split, its head
tokens, its cached final features), a fresh EAGLE network and print the teacher-forced held-out alpha after
every epoch at draft depths 1 and 2. With neither option it is the plain network: the baseline.

`--layers a,b`: EAGLE-3's feature fusion (Li et al. 2025), which feeds the draft low, middle and high
layers of the target instead of the top feature alone, shaped for the next token only. The input
feature becomes

    f_{j-1} + W [norm(h^a_{j-1}); norm(h^b_{j-1}); ...]      h^l: the target's residual stream after layer l

with W starting at zero (so it starts as the plain network). Deeper in a draft (depth 2) the network's
own g stands in for the whole input, as in decoding. The layers' outputs are cached in
DIR/hidden-<layers>.safetensors (float16, keyed as features.safetensors).

`--decoder-layers n`: n decoder layers of the target's shape instead of one (a costlier draft step).

`--tv-weight w`: adds w x the total variation between the target's top-k p and the draft's q (what alpha
at T=1 measures; `specdecode.distill.train.tv_loss`) to the forward-KL loss.

`--feature-weight w`: the weight of the smooth-L1 feature loss (`EagleObjective`'s, 1 in `specdecode distill`).

`--depth d --deep-epochs n`: as `specdecode distill`'s, the last n epochs also train draft tokens 2 .. d.

    python scripts/eagle_variants.py work/ft-d2 --out work/fused/base
    python scripts/eagle_variants.py work/ft-d2 --layers 3,15 --out work/fused/l3-15
    python scripts/eagle_variants.py work/ft-d2 --decoder-layers 2 --out work/fused/two
    python scripts/eagle_variants.py work/ft-d2 --tv-weight 5 --out work/fused/tv5

Research tooling: docs/distill.md gives the results.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm

from specdecode.distill.eagle import EagleObjective, init_eagle, sequence_key, target_features
from specdecode.distill.recipe import report_split
from specdecode.distill.teacher import TeacherData, load_teacher
from specdecode.distill.train import TrainConfig, check_loss_weights, evaluate, make_batches, train
from specdecode.models.loading import load_model
from specdecode.native.batched import attention_inputs, attention_then_mlp, decoder_stack
from specdecode.native.eagle import EagleNetwork, unrolled_mask
from specdecode.native.loading import native_from_hf_model
from specdecode.native.model import DecoderLayer, NativeTransformer, RMSNorm
from specdecode.native.rope import rope_for


@torch.no_grad()
def hidden_states(target: NativeTransformer, data: TeacherData, layers: Sequence[int], path: Path) -> list[torch.Tensor]:
    """[L_i, len(layers) * H] float16 per sequence: the residual stream after each of layers (0-based), cached in path."""
    keys = [sequence_key(ids) for ids in data.ids]
    if path.is_file():
        with safe_open(path, "pt") as f:
            if set(keys) <= set(f.keys()):
                return [f.get_tensor(key) for key in keys]
    out: dict[str, torch.Tensor] = {}
    for batch in tqdm(make_batches([len(t) for t in data.ids], 4096, random.Random(0)), desc="hidden states", unit="batch"):
        x, kept = target.embed(data.padded_ids(batch)), []  # [B, L, H]
        for number, layer in enumerate(target.layers[: max(layers) + 1]):
            x = decoder_stack([layer], target.config, x)
            if number in layers:
                kept.append(x)
        stacked = torch.cat(kept, dim=-1)  # [B, L, n * H]
        for row, i in enumerate(batch):
            out[keys[i]] = stacked[row, : len(data.ids[i])].half().contiguous()
    tmp = path.with_suffix(".tmp")
    save_file(out, tmp)
    tmp.replace(path)
    return [out[key] for key in keys]


class Fusion(nn.Module):
    """W [norm(h^a); norm(h^b); ...] -> [..., H], added to the final feature; W starts at zero."""

    def __init__(self, count: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.norms = nn.ModuleList(RMSNorm(hidden, eps, torch.float32) for _ in range(count))
        self.project = nn.Linear(count * hidden, hidden, bias=False)
        nn.init.zeros_(self.project.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., n * H] -> [..., H]
        parts = hidden.chunk(len(self.norms), dim=-1)
        return self.project(torch.cat([norm(part) for norm, part in zip(self.norms, parts)], dim=-1))


def unrolled_features(network: EagleNetwork, extra: Sequence[DecoderLayer], previous: torch.Tensor,
                      embedded: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """`EagleNetwork.unrolled_features` with the decoder layers extra after the network's own, each with its keys."""
    layers, config = [network.layer, *extra], network.config
    length = embedded.shape[1]
    cos, sin = rope_for(config, length, embedded.dtype)  # [L, 1, D]
    gqa = config.num_heads != config.num_kv_heads
    keys: list[list[torch.Tensor]] = [[] for _ in layers]
    values: list[list[torch.Tensor]] = [[] for _ in layers]
    outputs = []
    for level in range(1, depth + 1):
        x = network._input(previous, embedded)  # [B, L, H]
        mask = None if level == 1 else unrolled_mask(length, level, x.device)  # [L, level * L]
        for number, layer in enumerate(layers):
            q, k, v = attention_inputs(layer, config, x, cos, sin)  # [B, heads, L, D]
            keys[number].append(k)
            values[number].append(v)
            attended = F.scaled_dot_product_attention(q, torch.cat(keys[number], dim=2), torch.cat(values[number], dim=2),
                                                      attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
            x = attention_then_mlp(layer, x, attended)
        outputs.append(x)
        previous = F.pad(x[:, :-1], (0, 0, 1, 0))  # g at j - 1 read at j; zero at position 0
    return outputs


class FusedObjective(EagleObjective):
    """EagleObjective whose depth-1 input feature is f_{j-1} + fusion(h_{j-1}), through the network's layer and extra."""

    def __init__(self, network, fusion: Fusion | None, hidden: Sequence[torch.Tensor] | None, embedding, features,
                 depth=1, extra: Sequence[DecoderLayer] = (), tv_weight: float = 0.0, feature_weight: float = 1.0):
        super().__init__(network, embedding, features, feature_weight=feature_weight, depth=depth, tv_weight=tv_weight)
        self.fusion, self.hidden, self.extra = fusion, hidden, list(extra)

    def _g(self, indices, ids, depth, wanted=None):  # every position: an extra layer reads all outputs of the one before
        previous = self._shifted(indices, ids, 1)  # [B, L, H]
        if self.fusion is not None:
            h = torch.zeros(*ids.shape, self.hidden[indices[0]].shape[-1])
            for row, i in enumerate(indices):
                seq = self.hidden[i].float()
                h[row, 1 : len(seq)] = seq[:-1]
            previous = previous + self.fusion(h)
        return unrolled_features(self.network, self.extra, previous, F.embedding(ids, self.embedding), depth)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Train the network and return the report rows (also appended to OUT/log.jsonl)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="a `specdecode distill --eagle` work directory (teacher shards, features, init.pt)")
    parser.add_argument("--layers", default="", help="target layers (0-based) fused in, comma-separated (default none)")
    parser.add_argument("--decoder-layers", type=int, default=1, help="decoder layers of the network (default 1)")
    parser.add_argument("--tv-weight", type=float, default=0.0, help="weight of a total-variation term in the loss (default 0)")
    parser.add_argument("--feature-weight", type=float, default=1.0, help="weight of the feature loss (default 1)")
    parser.add_argument("--depth", type=int, default=1, help="draft tokens trained (default 1)")
    parser.add_argument("--deep-epochs", type=int, help="with --depth: the last N epochs train the deeper tokens (default every epoch)")
    parser.add_argument("--out", type=Path, required=True, help="where the checkpoint and the log go")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        layers = sorted({int(x) for x in args.layers.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--layers: comma-separated layer numbers, got {args.layers!r}")
    if args.decoder_layers < 1:
        parser.error(f"--decoder-layers: at least 1, got {args.decoder_layers}")
    try:
        check_loss_weights({"--tv-weight": args.tv_weight, "--feature-weight": args.feature_weight})
        config = TrainConfig(epochs=args.epochs, lr=args.lr, seed=args.seed, depth=args.depth, deep_epochs=args.deep_epochs)
    except ValueError as error:
        parser.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)

    settings = json.loads((args.dir / "data.json").read_text())
    data = load_teacher(args.dir)
    held, train_idx = report_split(args.dir, data)  # the distill report's split (its seed and held-out share)
    target = native_from_hf_model(load_model(settings["target"]).hf_model, torch.float32)
    if any(not 0 <= layer < target.config.num_layers for layer in layers):
        parser.error(f"--layers: the target's layers are 0 .. {target.config.num_layers - 1}, got {args.layers!r}")
    output_ids = torch.load(args.dir / "init.pt", weights_only=True)["output_ids"]
    output_index = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    output_index[output_ids] = torch.arange(output_ids.numel())
    features = target_features(target, data, args.dir)
    hidden = hidden_states(target, data, layers, args.dir / f"hidden-{'-'.join(map(str, layers))}.safetensors") if layers else None
    embedding = target.embed.weight.detach()
    network = init_eagle(target, output_ids, args.seed)
    fusion = Fusion(len(layers), target.config.hidden_size, target.config.rms_norm_eps) if layers else None
    extra = nn.ModuleList(DecoderLayer(network.config, torch.float32) for _ in range(args.decoder_layers - 1))
    del target
    model = nn.ModuleDict({"network": network, "extra": extra, **({"fusion": fusion} if fusion else {})})

    def objective(indices: Sequence[int]) -> FusedObjective:
        return FusedObjective(network, fusion, None if hidden is None else [hidden[i] for i in indices],
                              embedding, [features[i] for i in indices], extra=extra, tv_weight=args.tv_weight,
                              feature_weight=args.feature_weight)

    held_data, held_objective = data.subset(held), objective(held)
    log = args.out / "log.jsonl"
    started = time.perf_counter()
    rows: list[dict] = []

    def report(epoch: int) -> None:
        row = {"layers": layers, "decoder_layers": args.decoder_layers, "tv_weight": args.tv_weight,
               "feature_weight": args.feature_weight, "depth": args.depth, "epoch": epoch,
               "seconds": round(time.perf_counter() - started)}
        for depth in (1, 2):
            scores = evaluate(model, held_data, output_index, 2048, partial(held_objective.scored_logits, depth=depth))
            row[f"depth{depth}"] = {k: round(v, 4) for k, v in scores["all"].items() if k != "positions"}
            if depth == 1:
                row["categories"] = {c: round(s["alpha_greedy"], 4) for c, s in scores.items() if c != "all"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")

    training = objective(train_idx)

    def on_epoch(epoch: int) -> None:
        if epoch:
            report(epoch)
        training.depth = config.depth_in_epoch(epoch)

    train(model, data.subset(train_idx), output_index, config, args.out, loss_fn=training.loss, on_epoch=on_epoch)
    report(args.epochs)
    return rows


if __name__ == "__main__":
    main()
