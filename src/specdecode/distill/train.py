"""Training a draft to match the target's cached next-token distributions (knowledge distillation).

Loss: forward KL(p || q) per position (up to p's entropy), with p the target's top-k distribution
restricted to the draft's output vocabulary and renormalised, optionally plus a multiple of the total
variation 1 - sum min(p, q), which is what alpha at temperature 1 measures. Sequences are batched by length,
the batch order of each epoch comes from (seed, epoch), and a checkpoint (model, optimiser,
step) is written every `checkpoint_every` steps, so an interrupted run resumes where it stopped
and ends with the same weights (on the same machine and thread count: CPU float sums depend on the threads).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdecode.distill.teacher import TeacherData
from specdecode.native.batched import decoder_stack
from specdecode.native.model import NativeTransformer

__all__ = ["TrainConfig", "draft_logits", "make_batches", "distill_loss", "tv_loss", "head_loss", "evaluate", "train", "trained_seconds"]

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"


def check_loss_weights(weights: dict[str, float]) -> None:
    """Refuse, by its name, a loss weight that is negative, NaN or infinite."""
    for name, value in weights.items():
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a non-negative number, got {value!r}")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 5
    batch_tokens: int = 2048  # padded tokens per optimiser step
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    checkpoint_every: int = 100
    seed: int = 0
    depth: int = 1  # EAGLE drafts: the draft depths the loss trains (distill.eagle.EagleObjective)
    deep_epochs: int | None = None  # with depth > 1: the last deep_epochs epochs train them (None: every epoch), the rest depth 1
    tv_weight: float = 0.0  # adds tv_weight x the total variation (tv_loss, what alpha at T=1 measures) to the KL loss
    feature_weight: float = 1.0  # EAGLE drafts: the weight of the smooth-L1 loss of the predicted feature

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_tokens", "checkpoint_every", "depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        check_loss_weights({"tv_weight": self.tv_weight, "feature_weight": self.feature_weight})
        if self.deep_epochs is not None:
            if self.depth == 1:
                raise ValueError("deep_epochs applies to depth > 1")
            if isinstance(self.deep_epochs, bool) or not isinstance(self.deep_epochs, int) or not 1 <= self.deep_epochs <= self.epochs:
                raise ValueError(f"deep_epochs must be an integer in [1, epochs={self.epochs}], got {self.deep_epochs!r}")

    def depth_in_epoch(self, epoch: int) -> int:
        """The draft depths trained in epoch (from 0): depth in the last deep_epochs epochs, else 1."""
        deep = self.epochs if self.deep_epochs is None else self.deep_epochs
        return self.depth if epoch >= self.epochs - deep else 1


def draft_logits(model: NativeTransformer, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, L, K] for right-padded ids [B, L] from position 0: NativeTransformer.forward, batched, with autograd."""
    return model.lm_head(model.norm(decoder_stack(model.layers, model.config, model.embed(ids))))


def make_batches(lengths: Sequence[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Group sequence indices of similar length so that each batch pads to <= batch_tokens; shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and lengths[i] * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _targets(data: TeacherData, index: int, output_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft-head indices [n, k] (-1 where the token is outside the head) and renormalised p [n, k]."""
    idx = output_index[data.topk_ids[index]]  # [n, k]
    p = data.topk_logp[index].exp() * (idx >= 0)
    return idx, p / p.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def _batch(data: TeacherData, indices: Sequence[int], output_index: torch.Tensor):
    """Padded ids [B, L] and, flattened over the scored positions: batch rows, positions, head indices, p."""
    ids = data.padded_ids(indices)
    rows, positions, idx, p = [], [], [], []
    for row, i in enumerate(indices):
        first = data.first[i]
        n = len(data.topk_ids[i])
        rows.append(torch.full((n,), row))
        positions.append(torch.arange(first, first + n))
        target_idx, target_p = _targets(data, i, output_index)
        idx.append(target_idx)
        p.append(target_p)
    return ids, torch.cat(rows), torch.cat(positions), torch.cat(idx), torch.cat(p)


def _picked_logq(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """[n, k]: log q(idx_j) of the head's softmax over logits [n, K], 0 where idx_j = -1 (outside the head)."""
    return torch.where(idx >= 0, torch.log_softmax(logits.float(), dim=-1).gather(1, idx.clamp_min(0)), 0.0)


def _kl_term(logq: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -sum_j p_j log q_j (logq from _picked_logq, p [n, k])."""
    return -(p * logq).sum(dim=-1).mean()


def _tv_term(logq: torch.Tensor, idx: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Mean over positions of 1 - sum_j min(p_j, q_j), q_j = 0 outside the head."""
    return 1 - torch.minimum(p, logq.exp() * (idx >= 0)).sum(dim=-1).mean()


def distill_loss(logits: torch.Tensor, idx: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -sum_j p_j log q(idx_j): logits [n, K], idx [n, k] (-1 = outside the head), p [n, k]."""
    return _kl_term(_picked_logq(logits, idx), p)


def tv_loss(logits: torch.Tensor, idx: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Mean over positions of 1 - sum_j min(p_j, q(idx_j)): the total variation alpha at T=1 measures (top-k p;
    shapes as distill_loss)."""
    return _tv_term(_picked_logq(logits, idx), idx, p)


def head_loss(logits: torch.Tensor, idx: torch.Tensor, p: torch.Tensor, tv_weight: float = 0.0) -> torch.Tensor:
    """The draft head's training loss: distill_loss, plus tv_weight x tv_loss when tv_weight is set (shapes as
    distill_loss). Both read one log-softmax over the head, so its backward pass runs once."""
    logq = _picked_logq(logits, idx)  # [n, k]
    loss = _kl_term(logq, p)
    return loss + tv_weight * _tv_term(logq, idx, p) if tv_weight else loss


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, data: TeacherData, output_index: torch.Tensor, batch_tokens: int,
    logits_fn: Callable[[list[int], torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> dict:
    """Teacher-forced acceptance estimates on data, overall and per category.

    alpha_greedy: share of positions where the draft's argmax is the target's;
    alpha_t1: mean of sum_x min(p, q) over the target's top-k tokens (a lower bound of alpha at temperature 1);
    coverage: target probability mass (within its top-k) that the draft's head can propose.
    logits_fn(indices, ids [B, L], rows [n], positions [n]) -> [n, K], the logits at the scored positions,
    stands in for draft_logits(model, ids)[rows, positions], for a draft that reads more than the token ids
    of the sequences data[indices].
    """
    model.eval()
    sums: dict[str, list[float]] = {}
    for indices in make_batches([len(t) for t in data.ids], batch_tokens, random.Random(0)):
        ids, rows, positions, _, _ = _batch(data, indices, output_index)
        logits = logits_fn(indices, ids, rows, positions) if logits_fn else draft_logits(model, ids)[rows, positions]
        q = torch.softmax(logits.float(), dim=-1)  # [n, K]
        start = 0
        for i in indices:
            n = len(data.topk_ids[i])
            qi, start = q[start : start + n], start + n
            head = output_index[data.topk_ids[i]]  # [n, k]
            p = data.topk_logp[i].exp()
            q_at = qi.gather(1, head.clamp_min(0)) * (head >= 0)
            greedy = (head[:, 0] == qi.argmax(dim=-1)) & (head[:, 0] >= 0)
            stats = (float(greedy.sum()), float(torch.minimum(p, q_at).sum()), float((p * (head >= 0)).sum()), float(p.sum()), n)
            for key in ("all", data.categories[i]):
                acc = sums.setdefault(key, [0.0] * 5)
                for j, value in enumerate(stats):
                    acc[j] += value
    return {
        key: {"alpha_greedy": g / n, "alpha_t1": t1 / n, "coverage": covered / mass, "positions": int(n)}
        for key, (g, t1, covered, mass, n) in sorted(sums.items())
    }


def _lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10%."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(
    model: torch.nn.Module,
    train_data: TeacherData,
    output_index: torch.Tensor,
    config: TrainConfig,
    workdir: Path,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> torch.nn.Module:
    """Distil into model's parameters (in place), checkpointing to workdir/checkpoint.pt and resuming from it.

    loss_fn(indices, ids [B, L], rows [n], positions [n], idx [n, k], p [n, k]) -> loss stands in for the
    distillation loss of draft_logits (and config.tv_weight's term: loss_fn applies its own), for a draft that
    reads more than the token ids of train_data[indices].
    on_epoch(epoch) is called as each epoch starts (from 0; on resuming, for the epoch it resumes in too).
    """
    torch.manual_seed(config.seed)
    model.train().requires_grad_(True)
    trained = list(model.parameters())
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=config.lr
    )
    lengths = [len(t) for t in train_data.ids]
    epochs = [make_batches(lengths, config.batch_tokens, random.Random(config.seed * 7919 + e)) for e in range(config.epochs)]
    total = sum(len(e) for e in epochs)
    step, seconds_before = _resume(model, optimizer, Path(workdir), config)
    started = time.perf_counter()
    progress = tqdm(total=total, initial=step, desc="distilling", unit="step")
    done = 0
    for epoch, batches in enumerate(epochs):
        if on_epoch is not None and done + len(batches) > step:  # an epoch with steps left to run
            on_epoch(epoch)
        for indices in batches:
            if done < step:  # finished before the checkpoint we resumed from
                done += 1
                continue
            for group in optimizer.param_groups:
                group["lr"] = config.lr * _lr_factor(step, total, config.warmup_steps)
            ids, rows, positions, idx, p = _batch(train_data, indices, output_index)
            if loss_fn is None:
                loss = head_loss(draft_logits(model, ids)[rows, positions], idx, p, config.tv_weight)
            else:
                loss = loss_fn(indices, ids, rows, positions, idx, p)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            step += 1
            done += 1
            progress.update(1)
            progress.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}")
            if step % config.checkpoint_every == 0 or step == total:
                seconds = None if seconds_before is None else seconds_before + time.perf_counter() - started
                _checkpoint(model, optimizer, step, Path(workdir), config, seconds)
    progress.close()
    return model.eval().requires_grad_(False)


def _checkpoint(model: NativeTransformer, optimizer, step: int, workdir: Path, config: TrainConfig,
                seconds: float | None) -> None:
    """Save the training state at `step`; seconds: the training time up to it over every run (None: unknown)."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "config": asdict(config),
             "seconds": seconds}
    tmp = workdir / (CHECKPOINT_FILE + ".tmp")
    torch.save(state, tmp)
    tmp.replace(workdir / CHECKPOINT_FILE)  # never a half-written checkpoint


def _resume(model: NativeTransformer, optimizer, workdir: Path, config: TrainConfig) -> tuple[int, float | None]:
    """Load workdir's checkpoint if there is one (it must come from the same TrainConfig); return its step and
    the training seconds up to it (None from a checkpoint of an older specdecode, which did not record them)."""
    path = workdir / CHECKPOINT_FILE
    if not path.is_file():
        return 0, 0.0
    state = torch.load(path, weights_only=True)
    saved = {**asdict(TrainConfig()), **state["config"]}  # settings added since it was written take their defaults
    if saved != asdict(config):
        raise ValueError(f"{path} was written with other training settings; delete it or use another --out")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    logger.info("resuming distillation from step %d", state["step"])
    return int(state["step"]), state.get("seconds")


def trained_seconds(workdir: Path) -> float | None:
    """The training time of workdir's last checkpoint over every run that trained it (None: not recorded)."""
    return torch.load(Path(workdir) / CHECKPOINT_FILE, weights_only=True).get("seconds")
