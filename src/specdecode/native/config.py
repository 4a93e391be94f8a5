"""The shape of a Llama-family transformer, independent of where its weights come from."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["NativeConfig", "SUPPORTED_ROPE_TYPES", "HF_ARCHITECTURES", "PACKINGS", "check_packing"]

# 'dynamic' NTK scaling only changes the frequencies beyond max_position_embeddings, which the
# engine never reaches (its context is capped there), so it is plain RoPE here, as in transformers.
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")

# model_type values of the transformers configs the engine runs (specdecode.backends reads this)
_HF_ARCHITECTURES = {"llama", "qwen2", "mistral"}
HF_ARCHITECTURES = frozenset(_HF_ARCHITECTURES)
# layouts of the linear layers (NativeLM packing=; `specdecode.native.fast`)
PACKINGS = ("auto", "none", "packed", "dual")


def check_packing(packing: str) -> str:
    """packing itself, or a ValueError naming the parameter."""
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {', '.join(map(repr, PACKINGS))}, got {packing!r}")
    return packing


@dataclass
class NativeConfig:
    """Hyper-parameters of a Llama / Qwen2 / Mistral style decoder (RMSNorm, RoPE, GQA, SwiGLU)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # transformers' rope_parameters without rope_theta; None = plain RoPE
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # biases on the q/k/v projections (Qwen2; Llama with attention_bias=True)
    attention_out_bias: bool = False  # bias on the output projection (Llama with attention_bias=True)
    mlp_bias: bool = False
    max_position_embeddings: int = 2048
    sliding_window: int | None = None  # the engine caps its context here, so attention is always full
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    architecture: str = "llama"
    extra: dict[str, Any] = field(default_factory=dict)  # informational only (e.g. the GGUF model name)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NativeConfig.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if rope_type not in SUPPORTED_ROPE_TYPES:
                supported = ", ".join(SUPPORTED_ROPE_TYPES)
                raise ValueError(f"unsupported RoPE scaling {rope_type!r}; supported: {supported}")
            if self.rope_scaling.get("partial_rotary_factor", 1.0) != 1.0:
                raise ValueError("partial rotary embeddings (partial_rotary_factor != 1) are not supported")
            self.rope_scaling = {**self.rope_scaling, "rope_type": rope_type}
            self.rope_scaling.pop("type", None)

    @property
    def rope_type(self) -> str:
        return "default" if self.rope_scaling is None else self.rope_scaling["rope_type"]

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NativeConfig":
        return cls(**data)

    def to_hf_config(self):
        """The equivalent transformers config (LlamaConfig, Qwen2Config or MistralConfig), e.g. for a GGUF model."""
        from transformers import AutoConfig

        if self.architecture not in _HF_ARCHITECTURES:
            raise ValueError(f"no transformers config for architecture {self.architecture!r}")
        fields = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rope_parameters={"rope_theta": self.rope_theta, **(self.rope_scaling or {"rope_type": "default"})},
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
        )
        if self.architecture == "llama":
            fields.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        elif self.architecture == "mistral":
            fields.update(sliding_window=self.sliding_window)
        elif self.sliding_window is not None:  # qwen2
            fields.update(use_sliding_window=True, sliding_window=self.sliding_window)
        return AutoConfig.for_model(self.architecture, **fields)

    @classmethod
    def from_hf_config(cls, config) -> "NativeConfig":
        """From a transformers LlamaConfig, Qwen2Config or MistralConfig (v5: RoPE in config.rope_parameters)."""
        model_type = getattr(config, "model_type", None)
        if model_type not in _HF_ARCHITECTURES:
            architectures = getattr(config, "architectures", None) or [type(config).__name__]
            raise ValueError(
                f"unsupported architecture {model_type!r} ({', '.join(architectures)}); "
                f"the native engine runs {', '.join(sorted(_HF_ARCHITECTURES))}"
            )
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"{model_type}: unsupported activation {config.hidden_act!r} (the native MLP is SwiGLU)")
        rope = dict(getattr(config, "rope_parameters", None) or {})
        if any(isinstance(value, dict) for value in rope.values()):
            raise ValueError(f"{model_type}: per-layer RoPE parameters are not supported")
        rope_theta = rope.pop("rope_theta", None) or getattr(config, "rope_theta", None) or 10000.0
        rope.setdefault("rope_type", rope.pop("type", "default"))
        layer_types = getattr(config, "layer_types", None) or []
        sliding = getattr(config, "sliding_window", None) if (
            model_type == "mistral" or any(t == "sliding_attention" for t in layer_types)
        ) else None
        heads = config.num_attention_heads
        bias = bool(getattr(config, "attention_bias", False))
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rope_theta=float(rope_theta),
            rope_scaling=None if rope["rope_type"] == "default" else rope,
            rms_norm_eps=float(config.rms_norm_eps),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            attention_bias=bias or model_type == "qwen2",
            attention_out_bias=bias and model_type != "qwen2",
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=sliding,
            bos_token_id=getattr(config, "bos_token_id", None),
            eos_token_id=getattr(config, "eos_token_id", None),
            architecture=model_type,
        )
