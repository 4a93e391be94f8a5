"""Many prompts of different lengths decoded together on the native engine (distillation's training data).

Prompts are right padded to [B, W]. Every row keeps its own positions: its prompt fills slots 0 .. len_i - 1
of a static KV cache [B, KV, W + new, D] per layer, its n-th new token goes to slot len_i + n - 1 with RoPE
at that position, and it attends to its own filled slots only (a mask per row), so padding never changes
a row's arithmetic beyond float rounding. The prompt pass is teacher forced as in training
(`native.batched`), keeping each layer's keys and values; the tokens every prompt starts with (a chat
template's system prompt) run once for the whole batch. Once a quarter of the rows in the batch have
finished, they leave it (the caches are copied without their rows), so finished rows cost little.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdecode.native.batched import attention_inputs, attention_then_mlp
from specdecode.native.model import NativeTransformer
from specdecode.native.rope import rope_for

__all__ = ["Generated", "generate_batch"]


@dataclass
class Generated:
    """Per prompt: its new tokens (through the first end-of-sequence token), the model's top-k log-probabilities
    at each new token's position (of the distribution it was drawn from, temperature 1), and with features its
    final-norm outputs at positions 0 .. len + n - 2 (float16), the positions that predict a token."""

    tokens: list[list[int]]
    topk_ids: list[torch.Tensor]  # [n_i, k] int64
    topk_logp: list[torch.Tensor]  # [n_i, k] float32
    features: list[torch.Tensor] | None  # [len_i + n_i - 1, H] float16


def _shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many first tokens every prompt shares (a chat template's system prompt), leaving each one of its own."""
    if len(prompts) < 2:
        return 0
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    shared = 0
    while shared < limit and all(p[shared] == first[shared] for p in prompts):
        shared += 1
    return shared


def _prompt_pass(model: NativeTransformer, ids: torch.Tensor, shared: int, k_cache: list[torch.Tensor],
                 v_cache: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The final-norm outputs [B, W, H] of the right-padded prompts ids [B, W], teacher forced, each layer's keys
    and values written to cache slots 0 .. W - 1. The first `shared` positions, the same in every row, run once:
    their keys, values and outputs are copied to every row, and the rest attends to them."""
    config, (batch, width) = model.config, ids.shape
    gqa = config.num_heads != config.num_kv_heads
    prefix = model.embed(ids[:1, :shared])  # [1, P, H]
    x = model.embed(ids[:, shared:])  # [B, W - P, H]
    mask = torch.ones(width - shared, width, dtype=torch.bool).tril(diagonal=shared) if shared else None  # [W - P, W]
    for layer, k_layer, v_layer in zip(model.layers, k_cache, v_cache):
        if shared:
            q, k, v = attention_inputs(layer, config, prefix, cos[:shared], sin[:shared])  # [1, heads, P, D]
            k_layer[:, :, :shared], v_layer[:, :, :shared] = k, v
            prefix = attention_then_mlp(layer, prefix, F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                      enable_gqa=gqa))
        q, k, v = attention_inputs(layer, config, x, cos[shared:width], sin[shared:width])
        k_layer[:, :, shared:width], v_layer[:, :, shared:width] = k, v
        if shared:  # attend to the prefix's keys and values too (causal: the mask)
            k, v = k_layer[:, :, :width], v_layer[:, :, :width]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not shared, enable_gqa=gqa)
        x = attention_then_mlp(layer, x, attended)
    if shared:
        x = torch.cat([prefix.expand(batch, -1, -1), x], dim=1)
    return model.norm(x)


@torch.inference_mode()
def generate_batch(
    model: NativeTransformer,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    eos: Collection[int],
    top_k: int,
    generator: torch.Generator | None = None,
    features: bool = False,
) -> Generated:
    """Decode every prompt until an eos token or max_new_tokens: greedy, or sampled at temperature 1 from
    `generator` when one is given (one draw per row still in the batch at each step)."""
    if not prompts or min(len(p) for p in prompts) < 1:
        raise ValueError("prompts must be non-empty token id lists")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
    config = model.config
    lengths = torch.tensor([len(p) for p in prompts])  # [B]
    batch, width = len(prompts), int(lengths.max())
    slots = width + max_new_tokens
    if slots > config.max_position_embeddings:
        raise ValueError(f"prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) exceed the model's "
                         f"{config.max_position_embeddings} positions")
    if config.sliding_window is not None and slots > config.sliding_window:
        raise ValueError(f"prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) exceed the model's sliding "
                         f"window ({config.sliding_window}), which batched generation does not apply")
    ids = torch.zeros(batch, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
    cos, sin = rope_for(config, slots, model.dtype)  # [slots, 1, D]
    cache_shape = (batch, config.num_kv_heads, slots, config.head_dim)
    k_cache = [torch.zeros(cache_shape, dtype=model.dtype) for _ in model.layers]
    v_cache = [torch.zeros(cache_shape, dtype=model.dtype) for _ in model.layers]
    gqa = config.num_heads != config.num_kv_heads

    x = _prompt_pass(model, ids, _shared_prefix(prompts), k_cache, v_cache, cos, sin)  # [B, W, H]
    prompt_features = x.half() if features else None
    logits = model.lm_head(x[torch.arange(batch), lengths - 1])  # [B, V]: each prompt's last position

    eos_ids = torch.tensor(sorted(eos), dtype=torch.long)
    tokens = torch.zeros(batch, max_new_tokens, dtype=torch.long)
    topk_ids = torch.zeros(batch, max_new_tokens, top_k, dtype=torch.long)
    topk_logp = torch.zeros(batch, max_new_tokens, top_k)
    new_features = torch.zeros(batch, max_new_tokens, config.hidden_size, dtype=torch.float16) if features else None
    finished_at = torch.full((batch,), max_new_tokens)  # new tokens of each row, through its eos
    live = torch.arange(batch)  # [R]: the rows still in the batch (finished rows leave it together, below)
    done = torch.zeros(batch, dtype=torch.bool)  # [R]
    for step in range(max_new_tokens):
        logp = torch.log_softmax(logits.float(), dim=-1)  # [R, V]
        topk_logp[live, step], topk_ids[live, step] = logp.topk(top_k, dim=-1)
        if generator is None:
            token = topk_ids[live, step, 0]
        else:
            token = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
        tokens[live, step] = token
        ended = ~done & torch.isin(token, eos_ids)
        finished_at[live[ended]] = step + 1
        done |= ended
        if bool(done.all()) or step + 1 == max_new_tokens:
            break
        if 4 * int(done.sum()) >= len(live):  # a quarter of the rows have finished: drop them from the batch
            keep = ~done
            live, token, lengths, done = live[keep], token[keep], lengths[keep], done[keep]
            k_cache, v_cache = [k[keep] for k in k_cache], [v[keep] for v in v_cache]
        rows = torch.arange(len(live))
        positions = lengths + step  # [R]: the slot of this new token in each row
        end = int(positions.max()) + 1
        mask = (torch.arange(end)[None, :] <= positions[:, None])[:, None, None, :]  # [R, 1, 1, end]
        x = model.embed(token)[:, None]  # [R, 1, H]
        cos_rows, sin_rows = cos[positions][:, None], sin[positions][:, None]  # [R, 1, 1, D]
        for layer, k_layer, v_layer in zip(model.layers, k_cache, v_cache):
            q, k, v = attention_inputs(layer, config, x, cos_rows, sin_rows)  # q [R, Hq, 1, D], k, v [R, KV, 1, D]
            k_layer[rows, :, positions], v_layer[rows, :, positions] = k[:, :, 0], v[:, :, 0]
            attended = F.scaled_dot_product_attention(q, k_layer[:, :, :end], v_layer[:, :, :end], attn_mask=mask,
                                                      enable_gqa=gqa)
            x = attention_then_mlp(layer, x, attended)
        x = model.norm(x)  # [R, 1, H]
        if new_features is not None:
            new_features[live, step] = x[:, 0].half()
        logits = model.lm_head(x[:, 0])

    counts = finished_at.clamp_max(step + 1).tolist()
    kept_features = None
    if prompt_features is not None and new_features is not None:
        kept_features = [torch.cat([prompt_features[row, :length], new_features[row, : n - 1]])
                         for row, (length, n) in enumerate(zip([len(p) for p in prompts], counts))]
    return Generated([tokens[row, :n].tolist() for row, n in enumerate(counts)],
                     [topk_ids[row, :n] for row, n in enumerate(counts)],
                     [topk_logp[row, :n] for row, n in enumerate(counts)], kept_features)
