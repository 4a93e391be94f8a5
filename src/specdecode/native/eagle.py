"""An EAGLE-style draft network (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty"): one decoder layer that reads the target's own features.

The target's feature f_j is its final-norm output at position j (what its head reads). To predict
token j + 1 the network reads f_{j-1} and the token x_j:

    g_j = layer(fc([norm(f_{j-1}); norm(embed(x_j))]))      g_j ~ f_j, trained to regress it
    logits_j = head(g_j)                                    head: the target's output rows of K tokens

f_{-1} is zero. Deeper in a draft, where the target has not run yet, the network's own g stands in for
f. The token embedding is the target's, so the network takes embedded tokens; the head rows are a
buffer (fixed, not trained). Shapes: n positions, hidden H, K output tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.native.batched import attention_inputs, attention_then_mlp
from specdecode.native.config import NativeConfig
from specdecode.native.model import DecoderLayer, KVCache, RMSNorm, attention_mask
from specdecode.native.rope import rope_for

__all__ = ["EagleNetwork", "read_at_depth", "unrolled_mask"]


class EagleNetwork(nn.Module):
    """fc over [norm(previous feature); norm(token embedding)], one decoder layer of the target's shape, fixed head."""

    def __init__(self, config: NativeConfig, output_vocab_size: int, dtype: torch.dtype = torch.float32, device=None) -> None:
        super().__init__()
        if config.num_layers != 1:
            raise ValueError(f"an EAGLE network has one decoder layer; its config says num_layers={config.num_layers}")
        hidden = config.hidden_size
        self.config = config
        self.dtype = dtype
        self.feature_norm = RMSNorm(hidden, config.rms_norm_eps, dtype, device)
        self.embed_norm = RMSNorm(hidden, config.rms_norm_eps, dtype, device)
        self.fc = nn.Linear(2 * hidden, hidden, dtype=dtype, device=device)
        self.layer = DecoderLayer(config, dtype, device)
        self.register_buffer("head_weight", torch.zeros(output_vocab_size, hidden, dtype=dtype, device=device))  # [K, H]
        self.int8_head: nn.Module | None = None  # set by quantize_int8: the head rows in int8
        self.register_buffer("rope_cos", torch.zeros(0, 1, config.head_dim, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin", torch.zeros(0, 1, config.head_dim, dtype=dtype), persistent=False)

    @property
    def output_vocab_size(self) -> int:
        return self.head_weight.shape[0]

    def start_from_mean(self) -> None:
        """fc starts as the mean of its two (normalised) inputs, so the layer first sees a token-and-context mix."""
        hidden = self.config.hidden_size
        with torch.no_grad():
            eye = torch.eye(hidden, dtype=self.fc.weight.dtype, device=self.fc.weight.device)
            self.fc.weight.copy_(torch.cat([eye, eye], dim=1) * 0.5)
            self.fc.bias.zero_()

    def head(self, g: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., K]; int8: [n, H] -> [n, K]
        return F.linear(g, self.head_weight) if self.int8_head is None else self.int8_head(g)

    def quantize_int8(self) -> "EagleNetwork":
        """Run fc, the layer's linears and the head on int8 weights (`specdecode.native.quant`), in place.

        For drafting only: half of a float32 step's time on a CPU, since a step reads every weight once.
        The head rows' float buffer is kept (it is what the draft directory stores).
        """
        from specdecode.native.quant import Int8Linear, quantize_per_channel

        self.fc = Int8Linear.from_linear(self.fc)
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(self.layer, name, Int8Linear.from_linear(getattr(self.layer, name)))
        self.int8_head = Int8Linear(*quantize_per_channel(self.head_weight))
        return self

    def _input(self, previous: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:  # [..., H] x2 -> [..., H]
        return self.fc(torch.cat([self.feature_norm(previous), self.embed_norm(embedded)], dim=-1))

    def unrolled_features(self, previous: torch.Tensor, embedded: torch.Tensor, depth: int,
                          wanted: torch.Tensor | None = None) -> list[torch.Tensor]:
        """g of draft depths 1 .. depth [B, L, H] each, for whole sequences from position 0 (training).

        previous [B, L, H]: the target's features shifted by one (f_{j-1} at j, zero at 0); embedded [B, L, H].
        At depth 1 every position reads the target's feature, with causal attention. At depth d the network at
        position j reads its own depth d - 1 output at j - 1 in place of the target's feature, and attends as it
        does d - 1 steps into a draft: to the depth-1 keys (computed from the target's features) up to position
        j - d + 1, and to the depth-e key at position j - (d - e) for e = 2 .. d (`unrolled_mask`). So its logits
        at j are those of the d-th draft token when the tokens before it were the sequence's own (HASS, Zhang et
        al. 2024).

        wanted [B, L] bool: the positions whose g the caller reads (at every depth). Only they, and the positions
        deeper tokens read, go through the layer's output projection and MLP (most of its work); g is zero at
        the others. Every position's keys are still computed.
        """
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        if wanted is not None and wanted.shape != embedded.shape[:2]:
            raise ValueError(f"wanted must be [B, L] = {list(embedded.shape[:2])}, got {list(wanted.shape)}")
        layer, config = self.layer, self.config
        length = embedded.shape[1]
        cos, sin = rope_for(config, length, embedded.dtype)  # [L, 1, D]
        gqa = config.num_heads != config.num_kv_heads
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        for level in range(1, depth + 1):
            x = self._input(previous, embedded)  # [B, L, H]
            q, k, v = attention_inputs(layer, config, x, cos, sin)  # [B, heads, L, D]
            keys.append(k)
            values.append(v)
            if level == 1:  # causal over the keys made from the target's features
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            else:
                mask = unrolled_mask(length, level, x.device)  # [L, level * L]
                attended = F.scaled_dot_product_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
                                                          attn_mask=mask, enable_gqa=gqa)
            x = attention_then_mlp(layer, x, attended, None if wanted is None else read_at_depth(wanted, level, depth))
            outputs.append(x)
            previous = F.pad(x[:, :-1], (0, 0, 1, 0))  # g at j - 1 read at j; zero at position 0
        return outputs

    def new_cache(self, max_len: int) -> KVCache:
        """The layer's KV cache for positions [0, max_len), with RoPE tables to match."""
        if self.rope_cos.shape[0] < max_len:
            cos, sin = rope_for(self.config, max_len, self.dtype)  # [max_len, 1, D]
            self.rope_cos, self.rope_sin = cos.to(self.head_weight.device), sin.to(self.head_weight.device)
        return KVCache(self.config, max_len, self.dtype, self.head_weight.device)

    def step(self, previous: torch.Tensor, embedded: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        """g [n, H] at positions start .. start + n - 1 from previous and embedded [n, H], through `cache`.

        Slots 0 .. start - 1 of the cache must hold this sequence's earlier positions.
        """
        n = previous.shape[0]
        end = start + n
        if end > cache.max_len:
            raise ValueError(f"positions up to {end - 1} do not fit a cache of {cache.max_len}")
        positions = torch.arange(start, end, device=previous.device)
        mask = attention_mask(positions, end, self.config.num_heads // self.config.num_kv_heads)
        x = self._input(previous.to(self.dtype), embedded.to(self.dtype))
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]
        return self.layer(x, cos, sin, positions, cache.k[0], cache.v[0], end, mask)


def read_at_depth(wanted: torch.Tensor, level: int, depth: int) -> torch.Tensor:
    """[B, L] bool: the positions whose depth-`level` g is read when g of every depth up to `depth` is wanted at
    `wanted` [B, L]: j itself and, for the deeper tokens at j, j - 1 .. j - (depth - level) (each reads the g
    one position before it, one depth up, and attends to those positions' keys)."""
    read = wanted.clone()
    for shift in range(1, depth - level + 1):
        read[:, :-shift] |= wanted[:, shift:]
    return read


def unrolled_mask(length: int, depth: int, device=None) -> torch.Tensor:
    """[L, depth * L] bool, True = attend: what a depth-`depth` query at position j sees of the keys of depths 1 .. depth.

    Columns e * L + m hold depth e + 1's key at position m. Depth 1's keys up to j - depth + 1 are in the cache
    from the target's features; depth e >= 2 wrote only position j - (depth - e) on the way to this one.
    """
    j = torch.arange(length, device=device)[:, None]  # [L, 1]
    m = torch.arange(length, device=device)[None, :]  # [1, L]
    blocks = [m <= j - depth + 1] + [m == j - (depth - e) for e in range(2, depth + 1)]
    return torch.cat(blocks, dim=1)
