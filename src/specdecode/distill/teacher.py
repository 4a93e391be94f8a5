"""The target's side of distillation: its responses to the training prompts and its next-token distributions.

Everything is written to the work directory in safetensors shards as it goes, so an interrupted
run resumes at the first missing shard and training never runs the target again:
- `generate_responses`: the target answers the prompts (chat template, batched Hugging Face
  `generate`, greedy or sampled at temperature 1); the top-k log-probabilities of the target at
  each response position come from the same `generate` call (its raw logits). Prompts are batched
  within blocks of RESPONSE_BLOCK, so the shards of a complete block do not depend on the prompts
  after it, and a resumed run checks that each shard holds its batch's prompts;
- `cache_text`: one teacher-forced pass of the target over natural text.
Shards are named <series>-<batch>.safetensors: `responses` (the built-in or file prompts), `german` (the
German translation prompts, their own series so they do not move when prompts are added), `text`.
Each shard holds, per sequence j: `j.ids` [L], `j.topk_ids` / `j.topk_logp` [L - 1 - first, k] for
the predictions of tokens first+1 .. L-1, and the metadata lists categories and `first` offsets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from specdecode.distill.sources import TrainingPrompt
from specdecode.native.loading import end_of_sequence_ids

__all__ = [
    "TeacherData", "RESPONSE_BLOCK", "SHARD_SERIES", "response_batches", "generate_responses", "cache_text", "load_teacher",
    "chat_ids",
]

logger = logging.getLogger(__name__)

# Prompts are sorted by length (little padding) only within blocks of this many: 256 built-in prompts
# per category. The batches of a complete block, and so its shards, stay the same when prompts are added.
RESPONSE_BLOCK = 3072
SHARD_SERIES = ("responses", "german", "text")  # the shard files of a work directory, in the order they load


@dataclass
class TeacherData:
    """Sequences with the target's top-k next-token log-probabilities (temperature 1).

    ids[i]: [L_i] int64. Row r of topk_ids[i] / topk_logp[i] ([L_i - 1 - first[i], k]) is the
    target's distribution over token first[i] + r + 1 given ids[i][: first[i] + r + 1].
    """

    ids: list[torch.Tensor] = field(default_factory=list)
    first: list[int] = field(default_factory=list)
    topk_ids: list[torch.Tensor] = field(default_factory=list)
    topk_logp: list[torch.Tensor] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def num_positions(self) -> int:
        return sum(len(t) for t in self.topk_ids)

    def padded_ids(self, indices: Sequence[int]) -> torch.Tensor:
        """[B, L]: the sequences at indices, right-padded with 0 to the longest of them."""
        ids = torch.zeros(len(indices), max(len(self.ids[i]) for i in indices), dtype=torch.long)
        for row, i in enumerate(indices):
            ids[row, : len(self.ids[i])] = self.ids[i]
        return ids

    def subset(self, indices: Sequence[int]) -> "TeacherData":
        return TeacherData(*([getattr(self, f)[i] for i in indices] for f in ("ids", "first", "topk_ids", "topk_logp", "categories")))


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Prompt ids with the chat template applied when the tokenizer has one."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
    return tokenizer(prompt)["input_ids"]


def _save_shard(path: Path, rows: Sequence[tuple[str, list[int], int, torch.Tensor, torch.Tensor]]) -> None:
    """Write (category, ids, first, topk_ids, topk_logp) rows atomically: a shard is complete or absent."""
    tensors: dict[str, torch.Tensor] = {}
    for j, (_, ids, _, topk_ids, topk_logp) in enumerate(rows):
        tensors[f"{j}.ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"{j}.topk_ids"] = topk_ids.to(torch.int32).contiguous()
        tensors[f"{j}.topk_logp"] = topk_logp.to(torch.float16).contiguous()
    metadata = {"categories": json.dumps([r[0] for r in rows]), "first": json.dumps([r[2] for r in rows])}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, tmp, metadata=metadata)
    tmp.replace(path)


def response_batches(lengths: Sequence[int], batch_size: int, block: int = RESPONSE_BLOCK) -> list[list[int]]:
    """Prompt indices batched by similar length within each block of `block` consecutive prompts."""
    batches: list[list[int]] = []
    for start in range(0, len(lengths), block):
        order = sorted(range(start, min(start + block, len(lengths))), key=lambda i: lengths[i])
        batches += [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return batches


def _check_shard(path: Path, categories: list[str], encoded: list[list[int]]) -> None:
    """Refuse a shard whose rows do not start with the prompts of its batch (another run's data)."""
    with safe_open(path, "pt") as handle:
        recorded = json.loads(handle.metadata()["categories"])
        same = recorded == categories and all(
            handle.get_tensor(f"{j}.ids")[: len(ids)].tolist() == ids for j, ids in enumerate(encoded)
        )
    if not same:
        raise ValueError(f"{path} holds other prompts than its batch (data of other settings or sources); use another --out")


@torch.inference_mode()
def generate_responses(
    hf_model,
    tokenizer,
    prompts: Sequence[TrainingPrompt],
    workdir: Path,
    *,
    max_new_tokens: int,
    batch_size: int,
    top_k: int,
    sample_fraction: float,
    seed: int,
    max_prompt_tokens: int,
    block: int = RESPONSE_BLOCK,
    series: str = "responses",
) -> None:
    """The target's responses to prompts with its top-k distributions, one shard per batch (resumes).

    Every round(1 / sample_fraction)-th batch is sampled at temperature 1, the others are greedy;
    each batch reseeds torch from (seed, batch index), so a resumed run writes the same data.
    Shards (workdir/<series>-<batch>.safetensors) already there are checked against their batch's prompts, and kept.
    """
    if series not in SHARD_SERIES[:-1]:
        raise ValueError(f"series must be one of {SHARD_SERIES[:-1]}, got {series!r}")
    eos = end_of_sequence_ids(hf_model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    sampled_every = round(1 / sample_fraction) if sample_fraction > 0 else 0
    encoded_all = [chat_ids(tokenizer, p.text)[-max_prompt_tokens:] for p in prompts]
    batches = response_batches([len(ids) for ids in encoded_all], batch_size, block)
    shards = [Path(workdir) / f"{series}-{b:05d}.safetensors" for b in range(len(batches))]
    todo = []
    for b, (batch, shard) in enumerate(zip(batches, shards)):
        if shard.is_file():
            _check_shard(shard, [prompts[i].category for i in batch], [encoded_all[i] for i in batch])
        else:
            todo.append(b)
    for b in tqdm(todo, desc=f"target responses ({series})", unit="batch"):
        batch = [prompts[i] for i in batches[b]]
        encoded = [encoded_all[i] for i in batches[b]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])  # [B, W], left padded
        attention = (torch.arange(width)[None, :] >= torch.tensor([width - len(ids) for ids in encoded])[:, None]).long()
        do_sample = bool(sampled_every) and b % sampled_every == 0
        torch.manual_seed(seed * 1_000_003 + b)
        out = hf_model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=1.0 if do_sample else None,
            top_k=None,
            top_p=None,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,
        )
        logp = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # [B, new, V], raw logits
        values, indices = logp.topk(top_k, dim=-1)  # [B, new, k]
        del logp
        rows = []
        for i, (prompt, ids) in enumerate(zip(batch, encoded)):
            response: list[int] = []
            for token in out.sequences[i, width:].tolist():
                response.append(token)
                if token in eos:
                    break
            n = len(response)
            rows.append((prompt.category, ids + response, len(ids) - 1, indices[i, :n], values[i, :n]))
        _save_shard(shards[b], rows)


@torch.inference_mode()
def cache_text(
    hf_model, tokenizer, texts: Sequence[str], workdir: Path, *, top_k: int, max_tokens: int, batch_size: int = 8
) -> None:
    """Teacher-forced top-k distributions of the target over natural text (no chat template), one shard per batch."""
    sequences = [ids for ids in (tokenizer(t)["input_ids"][:max_tokens] for t in texts) if len(ids) >= 2]
    batches = [sequences[i : i + batch_size] for i in range(0, len(sequences), batch_size)]
    todo = [b for b in range(len(batches)) if not (Path(workdir) / f"text-{b:05d}.safetensors").is_file()]
    for b in tqdm(todo, desc="target on text", unit="batch"):
        chunk = batches[b]
        width = max(len(ids) for ids in chunk)
        input_ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attention = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, ids in enumerate(chunk):  # right padded: causal attention never sees the padding
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention[row, : len(ids)] = 1
        logits = hf_model(input_ids=input_ids, attention_mask=attention).logits  # [B, W, V]
        rows = []
        for row, ids in enumerate(chunk):
            values, indices = torch.log_softmax(logits[row, : len(ids) - 1].float(), dim=-1).topk(top_k, dim=-1)
            rows.append(("text", ids, 0, indices, values))
        _save_shard(Path(workdir) / f"text-{b:05d}.safetensors", rows)


def load_teacher(workdir: Path) -> TeacherData:
    """All shards of workdir, series by series in SHARD_SERIES order, each in batch order."""
    files = [file for series in SHARD_SERIES for file in sorted(Path(workdir).glob(f"{series}-*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"no teacher shards ({', '.join(s + '-*.safetensors' for s in SHARD_SERIES)}) in {workdir}")
    data = TeacherData()
    for file in files:
        tensors = load_file(file)
        with safe_open(file, "pt") as handle:
            metadata = handle.metadata()
        for j, (category, first) in enumerate(zip(json.loads(metadata["categories"]), json.loads(metadata["first"]))):
            data.ids.append(tensors[f"{j}.ids"].long())
            data.first.append(first)
            data.topk_ids.append(tensors[f"{j}.topk_ids"].long())
            data.topk_logp.append(tensors[f"{j}.topk_logp"].float())
            data.categories.append(category)
    return data
