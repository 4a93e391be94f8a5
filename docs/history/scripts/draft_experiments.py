"""Draft-design experiments on a finished `specdecode distill --target-layers ...` work directory.

Each one trains a variant on the work directory's training sequences and prints the teacher-forced
held-out alpha after every epoch (the same split and measure as the distill report). Research
tooling: the winners get built into `specdecode distill`; docs/distill.md gives the results.

    python scripts/draft_experiments.py features DIR          # the target's features -> DIR/features.safetensors
    python scripts/draft_experiments.py continue DIR                # more epochs of DIR's trained draft
    python scripts/draft_experiments.py continue DIR --loss kl+tv   # ... with a total-variation term
    python scripts/draft_experiments.py cut+features DIR      # DIR's trained draft, also fed the target's features
    python scripts/draft_experiments.py eagle DIR             # a one-layer EAGLE-style draft on the target's features

The target's feature f_j is its final-norm output at position j (what its head reads). A draft
predicting token j+1 may read f_{j-1}: with gamma = 1 the target has computed it by then.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from specdecode.distill.recipe import report_split
from specdecode.distill.teacher import load_teacher
from specdecode.distill.train import _batch, _lr_factor, distill_loss, draft_logits, evaluate, make_batches, tv_loss
from specdecode.native.batched import decoder_stack
from specdecode.drafters.distilled import build_draft_transformer
from specdecode.native import load_native
from specdecode.native.config import NativeConfig
from specdecode.native.model import DecoderLayer, NativeTransformer, RMSNorm
from specdecode.native.quant import Int8Embedding, quantize_per_channel

FEATURES = "features.safetensors"


class CutWithFeatures(nn.Module):
    """A trained cut draft whose input is emb(x_j) + W norm(f_{j-1}); W starts at 0 (the draft unchanged)."""

    def __init__(self, draft: NativeTransformer) -> None:
        super().__init__()
        self.draft = draft
        self.feature_norm = RMSNorm(draft.config.hidden_size, 1e-5, torch.float32)
        self.project = nn.Linear(draft.config.hidden_size, draft.config.hidden_size, bias=False)
        nn.init.zeros_(self.project.weight)

    def forward(self, previous: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # [B, L, H], [B, L] -> [B, L, K]
        x = self.draft.embed(ids) + self.project(self.feature_norm(previous))
        return self.draft.lm_head(self.draft.norm(decoder_stack(self.draft.layers, self.draft.config, x)))


class EagleDraft(nn.Module):
    """EAGLE (Li et al. 2024): fc([norm(f_{j-1}); norm(emb(x_j))]) -> one decoder layer -> g_j ~ f_j -> target head rows.

    The embedding (int8) and the head rows are the target's and stay fixed; g_j is also regressed on f_j.
    """

    def __init__(self, target: NativeTransformer, output_ids: torch.Tensor) -> None:
        super().__init__()
        config, hidden = target.config, target.config.hidden_size
        self.config = config
        self.embed = Int8Embedding(*quantize_per_channel(target.embed.weight), torch.float32)
        self.feature_norm = RMSNorm(hidden, 1e-5, torch.float32)
        self.embed_norm = RMSNorm(hidden, 1e-5, torch.float32)
        self.fc = nn.Linear(2 * hidden, hidden)
        self.layer = DecoderLayer(config, torch.float32)  # torch's default initialisation
        self.head = nn.Linear(hidden, output_ids.numel(), bias=False).requires_grad_(False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.eye(hidden)], dim=1) * 0.5)  # the inputs' mean
            self.fc.bias.zero_()
            self.head.weight.copy_(target.lm_head.weight[output_ids])

    def features(self, previous: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # -> g [B, L, H]
        x = self.fc(torch.cat([self.feature_norm(previous), self.embed_norm(self.embed(ids))], dim=-1))
        return decoder_stack([self.layer], self.config, x)

    def forward(self, previous: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(previous, ids))


def extract_features(workdir: Path, threads: int) -> None:
    """The target's final-norm output [L, hidden] (float16) for every sequence of workdir, keyed by its index."""
    torch.set_num_threads(threads)
    data = load_teacher(workdir)
    target = _target(workdir)
    head, target.lm_head = target.lm_head, nn.Identity()  # draft_logits-style forward, minus the head
    features, checked, agree = {}, 0, 0
    started = time.perf_counter()
    batches = make_batches([len(t) for t in data.ids], 4096, random.Random(0))
    with torch.no_grad():
        for number, indices in enumerate(batches, 1):
            ids = data.padded_ids(indices)
            out = target.norm(decoder_stack(target.layers, target.config, target.embed(ids)))  # [B, L, H]
            for row, i in enumerate(indices):
                f = out[row, : len(data.ids[i])]
                features[str(i)] = f.half().contiguous()
                first, n = data.first[i], len(data.topk_ids[i])  # check: the cached top-1 comes from these features
                agree += int((head(f[first : first + n]).argmax(-1) == data.topk_ids[i][:, 0]).sum())
                checked += n
            print(f"{number}/{len(batches)} batches, {time.perf_counter() - started:.0f} s", flush=True)
    save_file(features, workdir / FEATURES)
    print(f"top-1 of the head on these features = the cached top-1 at {agree}/{checked} positions")


def run_variant(args: argparse.Namespace) -> None:
    """Train args.experiment's variant on DIR's training sequences; print held-out alpha after each epoch."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    workdir = Path(args.dir)
    data = load_teacher(workdir)
    held, train_idx = report_split(workdir, data)  # the distill report's split (its seed and held-out share)
    train_data, held_out = data.subset(train_idx), data.subset(held)
    config = json.loads((workdir / "draft/draft_config.json").read_text())["native_config"]
    output_ids = torch.load(workdir / "init.pt", weights_only=True)["output_ids"]
    output_index = torch.full((config["vocab_size"],), -1)
    output_index[output_ids] = torch.arange(output_ids.numel())
    features = load_file(workdir / FEATURES) if args.experiment != "continue" else {}
    model = _build(args.experiment, workdir, NativeConfig.from_dict(config), output_ids)

    def stacked(global_indices: list[int], ids: torch.Tensor, shift: int) -> torch.Tensor:
        """[B, L, H]: the features f_{j - shift} of these sequences at positions j (0 before the start)."""
        out = torch.zeros(*ids.shape, config["hidden_size"])
        for row, i in enumerate(global_indices):
            f = features[str(i)].float()
            out[row, shift : len(f)] = f[: len(f) - shift]
        return out

    def logits_fn(sequence_ids: list[int]):
        """evaluate's logits_fn(indices, ids, rows, positions) -> [n, K] of the variant for data[indices];
        sequence_ids maps them to DIR's."""
        if args.experiment == "continue":
            return lambda indices, ids, rows, positions: draft_logits(model, ids)[rows, positions]
        return lambda indices, ids, rows, positions: model(stacked([sequence_ids[i] for i in indices], ids, 1), ids)[rows, positions]

    def second_position(indices: list[int], ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """EAGLE two draft tokens deep: its own predicted feature g_{j-1} in place of the target's f_{j-1}."""
        guessed = model.features(stacked([held[i] for i in indices], ids, 1), ids)  # g [B, L, H]
        return model(F.pad(guessed, (0, 0, 1, 0))[:, :-1], ids)[rows, positions]

    def report(label: str) -> None:
        print(label, json.dumps(evaluate(model, held_out, output_index, 2048, logits_fn(held))["all"]), flush=True)
        if args.experiment == "eagle":
            depth2 = evaluate(model, held_out, output_index, 2048, second_position)["all"]
            print("  second-position", json.dumps(depth2), flush=True)

    report("start")
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for p in trained if p.dim() >= 2], "weight_decay": 0.01},
                                   {"params": [p for p in trained if p.dim() < 2], "weight_decay": 0.0}], lr=args.lr)
    epochs = [make_batches([len(t) for t in train_data.ids], 2048, random.Random(100 + e)) for e in range(args.epochs)]
    total, step, started = sum(map(len, epochs)), 0, time.perf_counter()
    train_logits = logits_fn(train_idx)
    for epoch, batches in enumerate(epochs):
        model.train()
        for indices in batches:
            for group in optimizer.param_groups:
                group["lr"] = args.lr * _lr_factor(step, total, 10)
            ids, rows, positions, idx, p = _batch(train_data, indices, output_index)
            extra = 0.0
            if args.experiment == "eagle":  # also regress g_j on f_j
                sequences = [train_idx[i] for i in indices]
                g = model.features(stacked(sequences, ids, 1), ids)[rows, positions]
                logits = model.head(g)
                extra = F.smooth_l1_loss(g, stacked(sequences, ids, 0)[rows, positions])
            else:
                logits = train_logits(indices, ids, rows, positions)
            if args.loss == "kl+tv":
                extra = extra + 5 * tv_loss(logits, idx, p)
            loss = distill_loss(logits, idx, p) + extra
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            step += 1
        report(f"epoch {epoch + 1} ({time.perf_counter() - started:.0f} s)")


def _target(workdir: Path) -> NativeTransformer:
    """The target that built workdir's data, on the native engine with plain layers."""
    return load_native(json.loads((workdir / "data.json").read_text())["target"], packing="none").model.model


def _build(experiment: str, workdir: Path, native: NativeConfig, output_ids: torch.Tensor) -> nn.Module:
    """The variant, starting from workdir's finished training (checkpoint.pt) except for eagle."""
    if experiment == "eagle":
        return EagleDraft(_target(workdir), output_ids)
    init = torch.load(workdir / "init.pt", weights_only=True)["model"]
    draft = build_draft_transformer(native, output_ids.numel(), int8_embedding="embed.qweight" in init)
    draft.load_state_dict(torch.load(workdir / "checkpoint.pt", weights_only=True)["model"])
    return draft if experiment == "continue" else CutWithFeatures(draft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=["features", "continue", "cut+features", "eagle"])
    parser.add_argument("dir", help="a finished `specdecode distill` work directory")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--loss", choices=["kl", "kl+tv"], default="kl", help="kl+tv adds 5 x total variation")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.experiment == "features":
        extract_features(Path(args.dir), args.threads)
    else:
        run_variant(args)


if __name__ == "__main__":
    main()
