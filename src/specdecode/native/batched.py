"""The decoder layers over whole right-padded sequences at once, with autograd: training's forward.

It computes what `NativeTransformer.forward` computes position by position through the KV cache.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from specdecode.native.config import NativeConfig
from specdecode.native.model import DecoderLayer
from specdecode.native.rope import rope_for

__all__ = ["decoder_stack", "attention_inputs", "attention_then_mlp"]


def attention_inputs(layer: DecoderLayer, config: NativeConfig, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q [B, H, L, D], k and v [B, KV, L, D] of x [B, L, hidden], RoPE applied to q and k."""
    b, length, _ = x.shape
    h, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = layer.qkv(layer.attn_norm(x)).view(b, length, h + 2 * kv, d)
    qk = qkv[:, :, : h + kv]
    qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
    return tuple(t.transpose(1, 2) for t in (qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]))


def attention_then_mlp(layer: DecoderLayer, x: torch.Tensor, attended: torch.Tensor,
                       where: torch.Tensor | None = None) -> torch.Tensor:
    """The rest of the layer: x [B, L, hidden] + o(attended [B, H, L, D]), then + the MLP of that.

    where [B, L] bool: compute these positions only (the output is zero at the others), for training,
    which reads few of a sequence's positions: the output projection and the MLP are most of a layer's work.
    """
    b, length, _ = x.shape
    merged = attended.transpose(1, 2).reshape(b, length, -1)  # [B, L, H * D]
    if where is None:
        return _output_and_mlp(layer, x, merged)
    out = torch.zeros_like(x)
    out[where] = _output_and_mlp(layer, x[where], merged[where])  # [n, hidden] at the n positions of where
    return out


def _output_and_mlp(layer: DecoderLayer, x: torch.Tensor, merged: torch.Tensor) -> torch.Tensor:
    """x [..., hidden] + o(merged [..., H * D]), then + the MLP of that."""
    x = x + layer.o(merged)
    gate, up = layer.gate_up(layer.mlp_norm(x)).chunk(2, dim=-1)
    return x + layer.down(F.silu(gate) * up)


def decoder_stack(layers: Iterable[DecoderLayer], config: NativeConfig, x: torch.Tensor) -> torch.Tensor:
    """x [B, L, hidden] (positions 0..L-1) through decoder `layers` with causal attention, with autograd."""
    cos, sin = rope_for(config, x.shape[1], x.dtype)
    for layer in layers:
        q, k, v = attention_inputs(layer, config, x, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=config.num_heads != config.num_kv_heads)
        x = attention_then_mlp(layer, x, attended)
    return x
