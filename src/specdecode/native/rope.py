"""Rotary position embeddings: inverse frequencies for each scaling scheme, and the cos/sin tables.

The formulas follow transformers' `modeling_rope_utils` (same float32 arithmetic), so
tables agree with the Hugging Face models bit for bit.
"""

from __future__ import annotations

import math

import torch

from specdecode.native.config import NativeConfig

__all__ = ["inverse_frequencies", "rope_tables", "rope_for"]


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """1 / theta^(2i/dim) for i < dim/2, float32 [dim/2]."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(theta: float, dim: int, params: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # share of the unscaled frequency per dimension
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def inverse_frequencies(config: NativeConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq float32 [head_dim/2], attention scaling of cos/sin) for the config's RoPE scheme."""
    dim, theta, params = config.head_dim, config.rope_theta, config.rope_scaling or {}
    kind = config.rope_type
    if kind == "default":
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    if kind == "linear":
        return _base_inv_freq(theta, dim) / params["factor"], 1.0
    if kind == "dynamic":
        # NTK base at seq_len = max_position_embeddings: the factor cancels (positions never go beyond it)
        factor, length = params["factor"], config.max_position_embeddings
        base = theta * ((factor * length / length) - (factor - 1)) ** (dim / (dim - 2))
        return _base_inv_freq(base, dim), 1.0
    if kind == "llama3":
        return _llama3(_base_inv_freq(theta, dim), params), 1.0
    if kind == "yarn":
        return _yarn(theta, dim, params, config.max_position_embeddings)
    raise ValueError(f"unsupported RoPE scaling {kind!r}")


def rope_tables(config: NativeConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin float32 [length, head_dim] for positions 0..length-1.

    The sin table carries the sign of rotate_half: sin_signed = [-sin, sin], so that
    rope(x) = x * cos + roll(x, head_dim/2) * sin_signed, one roll instead of slice + neg + cat.
    """
    inv_freq, scaling = inverse_frequencies(config)
    freqs = torch.arange(length, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # [length, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [length, D]
    cos, sin = emb.cos() * scaling, emb.sin() * scaling
    half = config.head_dim // 2
    sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos, sin_signed


def rope_for(config: NativeConfig, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [L, 1, D] of positions 0..L-1 in dtype, broadcast over heads (sin with the sign of rotate_half)."""
    cos, sin = rope_tables(config, length)  # [L, D] float32
    return cos[:, None].to(dtype), sin[:, None].to(dtype)
