"""Distilling an EAGLE draft (`specdecode distill --eagle`): the target's features, the network, its loss.

The network (`specdecode.native.eagle.EagleNetwork`) predicts token j + 1 from the target's feature
f_{j-1} and the token x_j. Training reads the target's features of every training sequence: kept in the
teacher shards when the data was built with features (read from the target's passes that made the data),
otherwise computed once per sequence and kept in the work directory (features.safetensors, float16).
The loss is the distillation loss of the head's logits plus a smooth-L1 regression of the network's g_j
on f_j (EAGLE's feature loss), which is what lets the network stand in for the target's features deeper
in a draft.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from specdecode.distill.teacher import TeacherData
from specdecode.distill.train import check_loss_weights, head_loss, make_batches
from specdecode.drafters.eagle import is_eagle_draft, load_eagle
from specdecode.native.batched import decoder_stack
from specdecode.native.eagle import EagleNetwork
from specdecode.native.model import NativeTransformer

__all__ = ["FEATURES_FILE", "sequence_key", "target_features", "init_eagle", "eagle_from_draft", "EagleObjective"]

FEATURES_FILE = "features.safetensors"


def sequence_key(ids: torch.Tensor) -> str:
    """A sequence's key in the features file: the SHA-1 of its token ids, the only thing its features depend on."""
    return hashlib.sha1(ids.to(torch.int64).numpy().tobytes()).hexdigest()


@torch.no_grad()
def target_features(target: NativeTransformer, data: TeacherData, workdir: Path, batch_tokens: int = 4096) -> list[torch.Tensor]:
    """The target's final-norm outputs f [L_i - 1, H] (float16) at positions 0 .. L_i - 2 of every sequence of data.

    A sequence's features come from data.features where its shard kept them; the others are computed
    by the target and cached in workdir/features.safetensors. That file is keyed by each sequence's token
    ids (`sequence_key`), so a later run reads what it holds and computes only sequences it has not seen
    (a progress bar; batches of similar length): adding data does not recompute the features of the old.
    It is rewritten, holding the computed sequences of data only, when anything was added or is no longer used.
    """
    path = Path(workdir) / FEATURES_FILE
    kept = data.features if data.features else [None] * len(data)
    keys = [sequence_key(ids) for ids in data.ids]
    wanted = {key for key, f in zip(keys, kept) if f is None}
    stored: set[str] = set()
    features: dict[str, torch.Tensor] = {}
    if path.is_file():
        with safe_open(path, "pt") as f:
            stored = set(f.keys())
            features = {key: f.get_tensor(key) for key in stored & wanted}
    missing = sorted({key: i for i, key in enumerate(keys) if key in wanted and key not in features}.values())  # one index per new sequence
    batches = make_batches([len(data.ids[i]) for i in missing], batch_tokens, random.Random(0))
    for batch in tqdm(batches, desc="target features", unit="batch"):
        indices = [missing[b] for b in batch]
        ids = data.padded_ids(indices)
        out = target.norm(decoder_stack(target.layers, target.config, target.embed(ids)))  # [B, L, H]
        for row, i in enumerate(indices):
            features[keys[i]] = out[row, : len(data.ids[i]) - 1].half().contiguous()
    if stored != wanted:
        tmp = path.with_suffix(".tmp")
        save_file(features, tmp)
        tmp.replace(path)  # never a half-written file
    return [f if f is not None else features[key][: len(ids) - 1] for f, key, ids in zip(kept, keys, data.ids)]


def init_eagle(target: NativeTransformer, output_ids: torch.Tensor, seed: int) -> EagleNetwork:
    """A fresh EAGLE network for target: one decoder layer of its shape (torch's default initialisation), fc
    starting as the mean of its inputs, and the head rows of output_ids taken from the target's head.

    The head rows are rounded to bfloat16, as the draft directory stores them, so training sees what runs.
    """
    torch.manual_seed(seed)
    config = dataclasses.replace(target.config, num_layers=1, tie_word_embeddings=False)
    network = EagleNetwork(config, output_ids.numel())
    network.start_from_mean()
    with torch.no_grad():
        network.head_weight.copy_(target.lm_head.weight[output_ids].to(torch.bfloat16))
    return network


_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim")


def eagle_from_draft(directory: Path, target: NativeTransformer) -> tuple[EagleNetwork, torch.Tensor]:
    """The network (float32) and output_ids [K] of an EAGLE draft directory, to train further for target.

    Refused, naming continue_from, when it is not an EAGLE draft or its layer has another shape than target's.
    """
    if not is_eagle_draft(directory):
        raise ValueError(f"continue_from: {directory} is not an EAGLE draft directory (made by specdecode distill --eagle)")
    network, output_ids, _ = load_eagle(directory, torch.float32)
    theirs = {name: getattr(network.config, name) for name in _SHAPE_FIELDS}
    ours = {name: getattr(target.config, name) for name in _SHAPE_FIELDS}
    if theirs != ours or int(output_ids.max()) >= target.config.vocab_size:
        raise ValueError(f"continue_from: {directory} was made for another target ({theirs}, head up to token "
                         f"{int(output_ids.max())}; this target: {ours}, vocabulary {target.config.vocab_size})")
    return network, output_ids


class EagleObjective:
    """The network's logits and loss on sequences of one data set, reading their features and the target's embedding.

    embedding: the target's token embedding table [V, H]; features: f [L_i - 1, H] of each sequence, aligned
    with the data set whose indices the methods take. depth: the draft depths the loss trains (1: the first
    draft token only; d > 1 also the next d - 1, each reading the network's own previous g as decoding does,
    `EagleNetwork.unrolled_features`), weighted equally. tv_weight: adds tv_weight x the total variation
    (`train.tv_loss`, what alpha at T=1 measures) to the distillation loss at each depth.
    """

    def __init__(self, network: EagleNetwork, embedding: torch.Tensor, features: Sequence[torch.Tensor],
                 feature_weight: float = 1.0, depth: int = 1, tv_weight: float = 0.0) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        check_loss_weights({"tv_weight": tv_weight, "feature_weight": feature_weight})
        self.network = network
        self.embedding = embedding
        self.features = features
        self.feature_weight = feature_weight
        self.depth = depth
        self.tv_weight = tv_weight

    def _shifted(self, indices: Sequence[int], ids: torch.Tensor, shift: int) -> torch.Tensor:
        """[B, L, H]: f_{j - shift} of the sequences at each position j (zero before the start and in the padding)."""
        out = torch.zeros(*ids.shape, self.embedding.shape[1])
        for row, i in enumerate(indices):
            f = self.features[i].float()
            out[row, shift : len(f)] = f[: len(f) - shift]
        return out

    def _g(self, indices: Sequence[int], ids: torch.Tensor, depth: int,
           wanted: torch.Tensor | None = None) -> list[torch.Tensor]:  # depth x [B, L, H]
        return self.network.unrolled_features(self._shifted(indices, ids, 1), F.embedding(ids, self.embedding), depth,
                                              wanted)

    def logits(self, indices: Sequence[int], ids: torch.Tensor, depth: int = 1) -> torch.Tensor:
        """[B, L, K]: teacher forced; at depth 1 every position reads the target's previous feature, at depth d
        it is the d-th draft token's logits after d - 1 draft tokens that were the sequence's own."""
        return self.network.head(self._g(indices, ids, depth)[-1])

    def scored_logits(self, indices: Sequence[int], ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                      depth: int = 1) -> torch.Tensor:
        """[n, K]: `logits` at the n positions (rows, positions) only, computing no more than they read."""
        return self.network.head(self._g(indices, ids, depth, _positions_mask(ids, rows, positions))[-1][rows, positions])

    def logits_by_depth(self, indices: Sequence[int], ids: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """depth x [B, L, K]: `logits` at every depth 1 .. depth, from one unrolled pass."""
        return [self.network.head(g) for g in self._g(indices, ids, depth)]

    def loss(self, indices: Sequence[int], ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
             idx: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Mean over the trained depths of the head's distillation loss (plus tv_weight x its total variation)
        plus feature_weight x smooth-L1 of g_j against f_j (at the scored positions)."""
        f = self._shifted(indices, ids, 0)[rows, positions]  # [n, H]
        total = torch.zeros(())
        for g_all in self._g(indices, ids, self.depth, _positions_mask(ids, rows, positions)):
            g = g_all[rows, positions]  # [n, H]
            total = total + head_loss(self.network.head(g), idx, p, self.tv_weight) + self.feature_weight * F.smooth_l1_loss(g, f)
        return total / self.depth


def _positions_mask(ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B, L] bool, True at (rows, positions): where g is read, so the network's MLP runs there only."""
    wanted = torch.zeros(ids.shape, dtype=torch.bool)
    wanted[rows, positions] = True
    return wanted
