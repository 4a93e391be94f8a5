"""The decoder layers over whole right-padded sequences at once, with autograd: training's forward.

It computes what `NativeTransformer.forward` computes position by position through the KV cache.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from specdecode.native.config import NativeConfig
from specdecode.native.model import DecoderLayer
from specdecode.native.rope import rope_tables

__all__ = ["decoder_stack"]


def decoder_stack(layers: Iterable[DecoderLayer], config: NativeConfig, x: torch.Tensor) -> torch.Tensor:
    """x [B, L, hidden] (positions 0..L-1) through decoder `layers` with causal attention, with autograd."""
    b, length, _ = x.shape
    h, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
    cos, sin = rope_tables(config, length)  # [L, D] float32, sin with the sign of rotate_half
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)  # [L, 1, D]
    for layer in layers:
        qkv = layer.qkv(layer.attn_norm(x)).view(b, length, h + 2 * kv, d)
        qk = qkv[:, :, : h + kv]
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
        q, k, v = (t.transpose(1, 2) for t in (qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]))  # [B, heads, L, D]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != kv)  # [B, H, L, D]
        x = x + layer.o(out.transpose(1, 2).reshape(b, length, h * d))
        gate, up = layer.gate_up(layer.mlp_norm(x)).chunk(2, dim=-1)
        x = x + layer.down(F.silu(gate) * up)
    return x
