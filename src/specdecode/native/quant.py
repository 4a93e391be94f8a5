"""Weight-only int8 for `NativeTransformer`: int8 weights with one symmetric scale per output channel.

W ~ scale[:, None] * Wq with Wq = round(W / scale) in [-127, 127] and scale = max|W[row]| / 127.
Activations stay floating point: on CPU the matmul is torch's `_weight_int8pack_mm` (bfloat16
activations, int8 weights read as they are, float32 accumulation); elsewhere, or where that
kernel is missing or fails its one-time self-check, the weight is dequantized on the fly.
The token embedding is quantized per row the same way (shared with the head when tied), so the
model holds about a quarter of its float32 bytes. Norms, RoPE tables and the KV cache keep the
model's dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.native.model import NativeTransformer

__all__ = [
    "QUANTIZE_OPTIONS",
    "Int8Linear",
    "Int8Embedding",
    "quantize_per_channel",
    "quantize_model",
    "current_quantization",
    "int8_kernel_available",
]

QUANTIZE_OPTIONS = ("none", "int8")
_LAYER_LINEARS = ("qkv", "o", "gate_up", "down")
_KERNEL_DTYPE = torch.bfloat16  # the CPU kernel is vectorized for bfloat16 activations only
_KERNEL_K_MULTIPLE = 64  # in torch 2.13 the kernel returns garbage when in_features % 16 != 0: keep a margin


def check_quantize(quantize: str) -> str:
    """quantize itself, or a ValueError naming the parameter."""
    if quantize not in QUANTIZE_OPTIONS:
        raise ValueError(f"quantize must be one of {', '.join(map(repr, QUANTIZE_OPTIONS))}, got {quantize!r}")
    return quantize


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [out, in], float32 scales [out]) with weight ~ scales[:, None] * int8, symmetric per row."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    scales = w.abs().amax(dim=1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero row stays zero
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


@functools.cache
def int8_kernel_available() -> bool:
    """Whether torch's CPU int8 weight kernel exists here and computes a small product correctly."""
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, _KERNEL_K_MULTIPLE, generator=generator).to(_KERNEL_DTYPE)
    q, scales = quantize_per_channel(torch.randn(48, _KERNEL_K_MULTIPLE, generator=generator))
    try:
        y = op(x, q, scales.to(_KERNEL_DTYPE)).float()
    except RuntimeError:  # no CPU implementation in this build
        return False
    reference = x.float() @ (q.float() * scales.to(_KERNEL_DTYPE).float()[:, None]).t()
    return bool(torch.allclose(y, reference, rtol=2e-2, atol=2e-2 * float(reference.abs().max())))


class Int8Linear(nn.Module):
    """y = x (scale * Wq)^T + b with Wq int8 [out, in]; x and y keep their dtype."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)  # int8 [out, in]
        self.register_buffer("scales", scales.float())  # float32 [out]
        self.register_buffer("kernel_scales", scales.to(_KERNEL_DTYPE))  # what the CPU kernel takes
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        q, scales = quantize_per_channel(linear.weight)
        return cls(q, scales, linear.bias)

    @property
    def uses_kernel(self) -> bool:
        """Whether forward runs torch's int8 CPU kernel (else it dequantizes the weight each call)."""
        return (self.qweight.device.type == "cpu" and self.in_features % _KERNEL_K_MULTIPLE == 0
                and int8_kernel_available())

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight this layer stands for, [out, in]."""
        return (self.qweight.float() * self.scales[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        if self.uses_kernel:
            y = torch.ops.aten._weight_int8pack_mm(x.to(_KERNEL_DTYPE).contiguous(), self.qweight,
                                                   self.kernel_scales).to(x.dtype)
        else:
            y = F.linear(x, self.dequantized(x.dtype))
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Embedding(nn.Module):
    """Rows of an int8 table times their scales; shares the head's buffers when the embedding is tied."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)  # int8 [V, hidden]
        self.register_buffer("scales", scales.float())  # float32 [V]
        self.dtype = dtype

    def dequantized(self) -> torch.Tensor:
        """The table this embedding stands for, [V, hidden] (forward never builds it)."""
        return (self.qweight.float() * self.scales[:, None]).to(self.dtype)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, hidden]
        return (self.qweight[token_ids].float() * self.scales[token_ids, None]).to(self.dtype)


def quantize_model(model: NativeTransformer, quantize: str) -> NativeTransformer:
    """Replace the linear layers (head included) and the embedding by int8 ones, in place."""
    if check_quantize(quantize) == "none":
        return model
    if current_quantization(model) != "none":
        raise ValueError(f"the model is already quantized as {current_quantization(model)!r}")
    if not isinstance(model.lm_head, nn.Linear):
        raise ValueError(f"quantize={quantize!r} needs plain linear layers; the model is packed "
                         f"({type(model.lm_head).__name__}): quantize before packing, or build a fresh model")
    for layer in model.layers:
        for name in _LAYER_LINEARS:
            setattr(layer, name, Int8Linear.from_linear(getattr(layer, name)))
    head = Int8Linear.from_linear(model.lm_head)
    if isinstance(model.embed, Int8Embedding):  # already int8 (a draft cut from its target): kept as it is
        embed = model.embed
    elif model.config.tie_word_embeddings:
        embed = Int8Embedding(head.qweight, head.scales, model.dtype)  # the same int8 table
    else:
        embed = Int8Embedding(*quantize_per_channel(model.embed.weight), model.dtype)
    model.lm_head, model.embed = head, embed
    return model


def current_quantization(model: NativeTransformer) -> str:
    """'int8' when the model's head is an Int8Linear, else 'none'."""
    return "int8" if isinstance(model.lm_head, Int8Linear) else "none"
