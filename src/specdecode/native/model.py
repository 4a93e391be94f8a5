"""A lean Llama-family decoder in plain PyTorch, with a static KV cache indexed by absolute position.

Shapes: n tokens fed at once, H query heads, KV key/value heads, G = H / KV query heads per
key/value head, D head_dim, T cached positions, V vocabulary.

Compared with the Hugging Face modules this fuses q/k/v into one matmul and gate/up into
another, applies RoPE to q and k with one roll, adds the residual inside the output
matmuls, and folds the G query heads of a group into the query length so attention
runs on the cache as it is (no repeat of keys and values).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.native.config import NativeConfig
from specdecode.native.rope import rope_for

__all__ = ["KVCache", "NativeTransformer", "DecoderLayer", "attention_mask"]


class KVCache:
    """Preallocated keys and values: k[layer], v[layer] of shape [1, KV, max_len, D], slot t = position t.

    Entries beyond the current length are uninitialized or hold stale values from rolled-back
    tokens; they are overwritten before they are ever attended to, so rolling back is just moving
    a length.
    """

    def __init__(self, config: NativeConfig, max_len: int, dtype: torch.dtype, device: torch.device,
                 storage: torch.Tensor | None = None) -> None:
        # one uninitialized block: every slot is written before it is attended to, and on CPU the
        # pages of a large allocation become resident only as the context reaches them
        shape = (2, config.num_layers, 1, config.num_kv_heads, max_len, config.head_dim)
        if storage is not None and tuple(storage.shape) != shape:
            raise ValueError(f"storage must have shape {shape}, got {tuple(storage.shape)}")
        # storage given: a view of a larger cache (a sequence's slot in `native.slots.SlotCache`)
        self.storage = torch.empty(shape, dtype=dtype, device=device) if storage is None else storage
        self.k = list(self.storage[0].unbind(0))  # [1, KV, max_len, D] views
        self.v = list(self.storage[1].unbind(0))
        self.max_len = max_len
        # [max_len, hidden]: each position's final-norm output (what the head reads), once `keep_features` asks
        self.features: torch.Tensor | None = None
        self._feature_shape = (max_len, config.hidden_size)

    def keep_features(self) -> None:
        """From now on, forward also writes each position's final-norm output into features[position]."""
        if self.features is None:
            self.features = torch.empty(self._feature_shape, dtype=self.storage.dtype, device=self.storage.device)

    def nbytes(self) -> int:
        extra = 0 if self.features is None else self.features.numel() * self.features.element_size()
        return self.storage.numel() * self.storage.element_size() + extra


def attention_mask(positions: torch.Tensor, end: int, group: int) -> torch.Tensor | None:
    """[group * n, end] bool, True = attend: token i (at positions[i]) sees slots 0..positions[i].

    Rows in (query head of a key/value group, token) order, as DecoderLayer folds them. None for a single
    token, which attends to every slot up to its own.
    """
    if positions.shape[0] == 1:
        return None
    allowed = torch.arange(end, device=positions.device)[None, :] <= positions[:, None]  # [n, end]
    return allowed.repeat(group, 1)


@contextlib.contextmanager
def skipped_initialization() -> Iterator[None]:
    """Build nn.Linear / nn.Embedding without their random initialization (the weights are assigned next).

    On the meta device the initialization does nothing, but its first call imports torch._dynamo,
    which costs ~2 s of start-up.
    """
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved


def _linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype, device) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, hidden]
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class DecoderLayer(nn.Module):
    """Pre-norm block: x += attention(norm(x)); x += swiglu(norm(x))."""

    def __init__(self, config: NativeConfig, dtype: torch.dtype, device=None) -> None:
        super().__init__()
        h, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.qkv = _linear(config.hidden_size, (h + 2 * kv) * d, config.attention_bias, dtype, device)
        self.o = _linear(h * d, config.hidden_size, config.attention_out_bias, dtype, device)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.gate_up = _linear(config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, dtype, device)
        self.down = _linear(config.intermediate_size, config.hidden_size, config.mlp_bias, dtype, device)

    def forward(
        self,
        x: torch.Tensor,  # [n, hidden]
        cos: torch.Tensor,  # [n, 1, D]
        sin: torch.Tensor,  # [n, 1, D], sign of rotate_half included
        positions: torch.Tensor,  # [n]
        k_cache: torch.Tensor,  # [1, KV, T, D]
        v_cache: torch.Tensor,  # [1, KV, T, D]
        end: int,  # attend over cache slots [0, end)
        mask: torch.Tensor | None,  # [G*n, end] bool, True = attend; None = attend to all
    ) -> torch.Tensor:
        n = x.shape[0]
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.project(x, cos, sin)
        k_cache[0].index_copy_(1, positions, k.transpose(0, 1))  # [KV, n, D] into slots `positions`
        v_cache[0].index_copy_(1, positions, v.transpose(0, 1))
        # fold the G heads sharing a key/value head into the query length: [1, KV, G*n, D]
        q = q.reshape(n, kv, h // kv, d).permute(1, 2, 0, 3).reshape(1, kv, (h // kv) * n, d)
        out = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask)
        out = out.view(kv, h // kv, n, d).permute(2, 0, 1, 3).reshape(n, h * d)  # [n, H*D], head-major
        return self.output_and_mlp(x, out)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [n, H, D], k and v [n, KV, D] of x [n, hidden], RoPE applied to q and k (cos, sin [n, 1, D])."""
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(self.attn_norm(x)).view(x.shape[0], h + 2 * kv, d)  # [n, H + 2KV, D]
        qk = qkv[:, : h + kv]
        qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)  # RoPE on q and k at once
        return qk[:, :h], qk[:, h:], qkv[:, h + kv :]

    def output_and_mlp(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer: x [n, hidden] + o(attended [n, H*D], head-major), then + the MLP of that."""
        x = self._residual(x, self.o, attended)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)  # [n, I] each
        return self._residual(x, self.down, F.silu(gate) * up)

    @staticmethod
    def _residual(x: torch.Tensor, linear: nn.Module, y: torch.Tensor) -> torch.Tensor:
        """x + linear(y), with the add fused into the matmul where the layer allows it."""
        fused = getattr(linear, "forward_add", None)  # a packed layer (specdecode.native.fast)
        if fused is not None:
            return fused(y, x)
        if type(linear) is nn.Linear and linear.bias is None:
            return torch.addmm(x, y, linear.weight.t())
        return x + linear(y)


class NativeTransformer(nn.Module):
    """Embedding, decoder layers, final norm and head (tied to the embedding or not)."""

    def __init__(self, config: NativeConfig, dtype: torch.dtype = torch.float32, device=None) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(config, dtype, device) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, False, dtype, device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("rope_cos", torch.zeros(0, 1, config.head_dim, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin", torch.zeros(0, 1, config.head_dim, dtype=dtype), persistent=False)

    def reset_rope_tables(self) -> None:
        """Empty RoPE tables on the CPU, which `new_cache` fills: for a model built on the meta device."""
        self.rope_cos = torch.zeros(0, 1, self.config.head_dim, dtype=self.dtype)
        self.rope_sin = torch.zeros(0, 1, self.config.head_dim, dtype=self.dtype)

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device  # the embedding may be an int8 table (specdecode.native.quant)

    def new_cache(self, max_len: int) -> KVCache:
        """A KV cache for positions [0, max_len), with RoPE tables to match."""
        self.ensure_rope(max_len)
        return KVCache(self.config, max_len, self.dtype, self.device)

    def ensure_rope(self, max_len: int) -> None:
        """RoPE tables for positions [0, max_len) (what a cache of max_len positions needs)."""
        if max_len > self.config.max_position_embeddings:
            raise ValueError(f"max_len {max_len} exceeds max_position_embeddings {self.config.max_position_embeddings}")
        if self.rope_cos.shape[0] < max_len:
            cos, sin = rope_for(self.config, max_len, self.dtype)  # [max_len, 1, D]
            self.rope_cos, self.rope_sin = cos.to(self.device), sin.to(self.device)

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        last_only: bool = False,
        end: int | None = None,
    ) -> torch.Tensor:
        """Logits [n, V] (or [1, V] with last_only) for token_ids [n] at positions [n].

        Writes each token's keys and values into its position's cache slot; the token at
        position p attends to slots 0..p, which must hold the sequence's earlier tokens. With
        cache.features allocated it also writes each token's final-norm output there.
        end: max(positions) + 1 when the caller knows it (NativeLM does), so that a compiled forward
        does not break its graph to read it from the tensor; None checks and computes it here.
        """
        if end is None:
            low, high = (int(p) for p in torch.aminmax(positions))
            end = high + 1
            if end > cache.max_len or low < 0:
                raise ValueError(f"positions must lie in [0, {cache.max_len}), got [{low}, {high}]")
        mask = attention_mask(positions, end, self.config.num_heads // self.config.num_kv_heads)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # [n, 1, D]
        x = self.embed(token_ids)  # [n, hidden]
        for layer, k_cache, v_cache in zip(self.layers, cache.k, cache.v):
            x = layer(x, cos, sin, positions, k_cache, v_cache, end, mask)
        if cache.features is not None:  # every position's feature, even with last_only
            x = self.norm(x)
            cache.features.index_copy_(0, positions, x)
            return self.lm_head(x[-1:] if last_only else x)
        if last_only:
            x = x[-1:]
        return self.lm_head(self.norm(x))  # [n, V]
