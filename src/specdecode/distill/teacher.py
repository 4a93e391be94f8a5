"""The target's side of distillation: its responses to the training prompts and its next-token distributions.

Everything is written to the work directory in safetensors shards as it goes, so an interrupted
run resumes at the first missing shard and training never runs the target again:
- `generate_responses`: the target answers the prompts (chat template, batched, greedy or sampled at
  temperature 1) on the native engine (`native.batch_generate`) where its architecture runs there
  (`native_teacher`), otherwise with Hugging Face `generate`; the top-k log-probabilities of the target
  at each response position come from the same pass (raw logits). Prompts are batched within blocks of
  RESPONSE_BLOCK, so the shards of a complete block do not depend on the prompts after it, and a
  resumed run checks that each shard holds its batch's prompts;
- `cache_text`: one teacher-forced pass of the target over natural text.
With `features=True` (an EAGLE draft's data, native engine only) both also keep the target's final-norm
outputs from the same passes, so no second pass of the target is needed.
Shards are named <series>-<batch>.safetensors: `responses` (the built-in or file prompts), `german` (the
German translation prompts, their own series so they do not move when prompts are added), `text`.
Each shard holds, per sequence j: `j.ids` [L], `j.topk_ids` / `j.topk_logp` [L - 1 - first, k] for
the predictions of tokens first+1 .. L-1, with `features` `j.features` [L - 1, H] (float16: the final-norm
outputs at positions 0 .. L-2, the ones that predict a token), and the metadata lists categories, `first`
offsets and the seconds the target took to make the shard (`shard_seconds` sums them over resumed runs).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from specdecode.distill.sources import TrainingPrompt
from specdecode.native.batch_generate import generate_batch
from specdecode.native.batched import decoder_stack
from specdecode.native.config import HF_ARCHITECTURES
from specdecode.native.fast import pack_linears, packing_available
from specdecode.native.loading import end_of_sequence_ids, native_from_hf_model
from specdecode.native.model import NativeTransformer

__all__ = [
    "TeacherData", "native_teacher", "RESPONSE_BLOCK", "SHARD_SERIES", "response_batches", "generate_responses",
    "cache_text", "load_teacher", "chat_ids", "shard_seconds",
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
    features[i]: the target's final-norm outputs [L_i - 1, H] (float16) at positions 0 .. L_i - 2, or None
    where the shard has none (data built without features).
    """

    ids: list[torch.Tensor] = field(default_factory=list)
    first: list[int] = field(default_factory=list)
    topk_ids: list[torch.Tensor] = field(default_factory=list)
    topk_logp: list[torch.Tensor] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    features: list[torch.Tensor | None] = field(default_factory=list)

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
        return TeacherData(*([getattr(self, f)[i] for i in indices] for f in ("ids", "first", "topk_ids", "topk_logp", "categories", "features")))


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Prompt ids with the chat template applied when the tokenizer has one."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
    return tokenizer(prompt)["input_ids"]


def native_teacher(hf_model) -> NativeTransformer | None:
    """hf_model on the native engine (float32; linear layers prepacked for oneDNN where it runs), which makes the
    data faster than Hugging Face `generate`; None when its architecture does not run there."""
    if getattr(hf_model.config, "model_type", None) not in HF_ARCHITECTURES:
        return None
    model = native_from_hf_model(hf_model, torch.float32)
    return pack_linears(model, "packed") if packing_available(torch.float32) else model


def _save_shard(path: Path, rows: Sequence[tuple[str, list[int], int, torch.Tensor, torch.Tensor, torch.Tensor | None]],
                seconds: float) -> None:
    """Write (category, ids, first, topk_ids, topk_logp, features or None) rows atomically: a shard is complete or absent.
    seconds: how long the target took to make it."""
    tensors: dict[str, torch.Tensor] = {}
    for j, (_, ids, _, topk_ids, topk_logp, features) in enumerate(rows):
        tensors[f"{j}.ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"{j}.topk_ids"] = topk_ids.to(torch.int32).contiguous()
        tensors[f"{j}.topk_logp"] = topk_logp.to(torch.float16).contiguous()
        if features is not None:
            tensors[f"{j}.features"] = features.to(torch.float16).contiguous()
    metadata = {"categories": json.dumps([r[0] for r in rows]), "first": json.dumps([r[2] for r in rows]),
                "seconds": f"{seconds:.2f}"}
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


def _refuse_extra_shards(workdir: Path, series: str, count: int) -> None:
    """Refuse shards of `series` numbered `count` or more: another run's data (it would be loaded with this one's)."""
    extra = sorted(f.name for f in Path(workdir).glob(f"{series}-*.safetensors") if int(f.stem.split("-")[-1]) >= count)
    if extra:
        raise ValueError(f"{workdir} holds {len(extra)} {series} shards beyond this run's {count} ({extra[0]}, ...): "
                         "data of other settings or sources; use another --out")


def sampled_batch(b: int, fraction: float) -> bool:
    """Whether response batch b is sampled at temperature 1 (else greedy): `fraction` of the batches, spread evenly
    (b is sampled when ceil((b + 1) f) > ceil(b f), in exact fractions; for f = 1/n, every n-th batch from 0)."""
    f = Fraction(fraction).limit_denominator(10_000)
    return math.ceil((b + 1) * f) > math.ceil(b * f)


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
    native: NativeTransformer | None = None,
    features: bool = False,
) -> None:
    """The target's responses to prompts with its top-k distributions, one shard per batch (resumes).

    sample_fraction of the batches are sampled at temperature 1 (`sampled_batch`), the others are greedy;
    each batch reseeds its sampler from (seed, batch index), so a resumed run writes the same data.
    Shards (workdir/<series>-<batch>.safetensors) already there are checked against their batch's prompts, and kept.
    native: hf_model on the native engine (`native_teacher`), which then makes the responses; None: `generate`.
    features: also keep the target's final-norm outputs of each sequence, from the same pass (needs native).
    """
    if series not in SHARD_SERIES[:-1]:
        raise ValueError(f"series must be one of {SHARD_SERIES[:-1]}, got {series!r}")
    if features and native is None:
        raise ValueError("features: the target's features come from the native engine; pass native=")
    eos = end_of_sequence_ids(hf_model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    encoded_all = [chat_ids(tokenizer, p.text)[-max_prompt_tokens:] for p in prompts]
    batches = response_batches([len(ids) for ids in encoded_all], batch_size, block)
    shards = [Path(workdir) / f"{series}-{b:05d}.safetensors" for b in range(len(batches))]
    _refuse_extra_shards(workdir, series, len(batches))
    todo = []
    for b, (batch, shard) in enumerate(zip(batches, shards)):
        if shard.is_file():
            _check_shard(shard, [prompts[i].category for i in batch], [encoded_all[i] for i in batch])
        else:
            todo.append(b)
    for b in tqdm(todo, desc=f"target responses ({series})", unit="batch"):
        batch = [prompts[i] for i in batches[b]]
        encoded = [encoded_all[i] for i in batches[b]]
        do_sample = sampled_batch(b, sample_fraction)
        started = time.perf_counter()
        batch_seed = seed * 1_000_003 + b
        if native is not None:
            made = generate_batch(native, encoded, max_new_tokens, eos=eos, top_k=top_k, features=features,
                                  generator=torch.Generator().manual_seed(batch_seed) if do_sample else None)
            answers = zip(made.tokens, made.topk_ids, made.topk_logp, made.features or [None] * len(encoded))
        else:
            torch.manual_seed(batch_seed)
            answers = _hf_answers(hf_model, encoded, max_new_tokens, do_sample, pad, eos, top_k)
        rows = [(prompt.category, ids + response, len(ids) - 1, topk_ids, topk_logp, f)
                for prompt, ids, (response, topk_ids, topk_logp, f) in zip(batch, encoded, answers)]
        _save_shard(shards[b], rows, time.perf_counter() - started)


def _hf_answers(hf_model, encoded: list[list[int]], max_new_tokens: int, do_sample: bool, pad: int, eos: set[int],
                top_k: int) -> list[tuple[list[int], torch.Tensor, torch.Tensor, None]]:
    """Hugging Face `generate` on left-padded prompts: per prompt its response (through the first eos) and the
    top-k ids and log-probabilities [n, k] at each response position (no features)."""
    width = max(len(ids) for ids in encoded)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])  # [B, W], left padded
    attention = (torch.arange(width)[None, :] >= torch.tensor([width - len(ids) for ids in encoded])[:, None]).long()
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
    answers = []
    for i in range(len(encoded)):
        response: list[int] = []
        for token in out.sequences[i, width:].tolist():
            response.append(token)
            if token in eos:
                break
        answers.append((response, indices[i, : len(response)], values[i, : len(response)], None))
    return answers


@torch.inference_mode()
def cache_text(
    hf_model, tokenizer, texts: Sequence[str], workdir: Path, *, top_k: int, max_tokens: int, batch_size: int = 8,
    native: NativeTransformer | None = None, features: bool = False,
) -> None:
    """Teacher-forced top-k distributions of the target over natural text (no chat template), one shard per batch:
    on the native engine when native is given (hf_model's `native_teacher`), and with features also its
    final-norm outputs from the same pass (which needs native)."""
    if features and native is None:
        raise ValueError("features: the target's features come from the native engine; pass native=")
    sequences = [ids for ids in (tokenizer(t)["input_ids"][:max_tokens] for t in texts) if len(ids) >= 2]
    batches = [sequences[i : i + batch_size] for i in range(0, len(sequences), batch_size)]
    _refuse_extra_shards(workdir, "text", len(batches))
    todo = []
    for b, chunk in enumerate(batches):  # a shard already there must hold its batch's texts (the file may have changed)
        shard = Path(workdir) / f"text-{b:05d}.safetensors"
        if shard.is_file():
            _check_shard(shard, ["text"] * len(chunk), chunk)
        else:
            todo.append(b)
    for b in tqdm(todo, desc="target on text", unit="batch"):
        started = time.perf_counter()
        chunk = batches[b]
        width = max(len(ids) for ids in chunk)
        input_ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attention = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, ids in enumerate(chunk):  # right padded: causal attention never sees the padding
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention[row, : len(ids)] = 1
        if native is not None:
            normed = native.norm(decoder_stack(native.layers, native.config, native.embed(input_ids)))  # [B, W, H]
            logits = native.lm_head(normed)  # [B, W, V]
        else:
            logits = hf_model(input_ids=input_ids, attention_mask=attention).logits  # [B, W, V]
        rows = []
        for row, ids in enumerate(chunk):
            values, indices = torch.log_softmax(logits[row, : len(ids) - 1].float(), dim=-1).topk(top_k, dim=-1)
            f = normed[row, : len(ids) - 1] if features else None  # [len - 1, H]
            rows.append(("text", ids, 0, indices, values, f))
        _save_shard(Path(workdir) / f"text-{b:05d}.safetensors", rows, time.perf_counter() - started)


def _shard_files(workdir: Path) -> list[Path]:
    """The shard files of workdir, series by series in SHARD_SERIES order, each in batch order."""
    return [file for series in SHARD_SERIES for file in sorted(Path(workdir).glob(f"{series}-*.safetensors"))]


def shard_seconds(workdir: Path) -> float | None:
    """The seconds the target took to make all shards of workdir, over every run that wrote some; None when
    a shard does not record it (written by an older specdecode)."""
    total = 0.0
    for file in _shard_files(workdir):
        with safe_open(file, "pt") as handle:
            seconds = handle.metadata().get("seconds")
        if seconds is None:
            return None
        total += float(seconds)
    return total


def load_teacher(workdir: Path) -> TeacherData:
    """All shards of workdir, series by series in SHARD_SERIES order, each in batch order (features where kept)."""
    files = _shard_files(workdir)
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
            data.features.append(tensors.get(f"{j}.features"))
    return data
