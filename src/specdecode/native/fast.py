"""Optional CPU speed-ups for `NativeTransformer`: oneDNN-prepacked linear layers and torch.compile.

Decoding and verification feed 1..16 rows at a time, so every matmul streams its whole weight
from memory. Measured on SmolLM2-135M, float32, 2 idle Xeon cores (bench.py --quick):
- plain weights (MKL): T(1) 53 ms, T(5)/T(1) 1.7;
- oneDNN, weights reordered once into its blocked layout ('packed'): T(1) 65 ms, T(5)/T(1) 1.15;
- DualLinear ('dual', the float32 default for one row per call) keeps both: MKL's gemv for one row, oneDNN for several:
  T(1) 41 ms, the best single row, and several rows cost what 'packed' costs (T(5) ~66-79 ms).
  Its T(k)/T(1) is ~1.6-1.9 only because its T(1) is lower: float32 arithmetic for k rows is not
  free on 2 cores. Using the plain copy for several rows of the narrow layers (qkv, o, down) was
  tried and is slower (T(5) +10 ms). bfloat16 'packed' (AMX) is flat: T(5)/T(1) ~1.1.
Packed weights are opaque oneDNN tensors: CPU only, not in the state dict.
"""

from __future__ import annotations

import torch
from torch import nn

from specdecode.native.model import NativeTransformer

__all__ = [
    "PackedLinear",
    "DualLinear",
    "pack_linears",
    "current_packing",
    "packing_available",
    "compiled_forward",
]

def packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN can pack linear weights of this dtype here (bfloat16 needs AVX512 or AVX-NE-CONVERT)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(nn.Module):
    """y = x W^T + b with W reordered once for oneDNN (CPU, float32 or bfloat16)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)  # opaque oneDNN tensor [out, in]
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + x W^T + b, the add fused into the matmul."""
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.bias, "add")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class DualLinear(PackedLinear):
    """A PackedLinear that also keeps a plain copy of the weight for single rows (2x the weight memory).

    One row is a matrix-vector product, where MKL's gemv on a plain layout streams memory faster
    than oneDNN's blocked one; a layer with more outputs than inputs keeps W^T [in, out], whose
    rows stream better there. Several rows go through oneDNN as in PackedLinear.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        weight = linear.weight.detach()
        self.transposed = weight.shape[0] > weight.shape[1]
        self.plain = weight.t().contiguous() if self.transposed else weight  # [in, out] or [out, in] (shared)

    def _matrix(self) -> torch.Tensor:  # [in, out] view for mm
        return self.plain if self.transposed else self.plain.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1:
            return super().forward(x)
        if self.bias is None:
            return torch.mm(x, self._matrix())
        return torch.addmm(self.bias, x, self._matrix())

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1:
            return super().forward_add(x, residual)
        out = torch.addmm(residual, x, self._matrix())
        return out if self.bias is None else out + self.bias


class TransposedEmbedding(nn.Module):
    """Token embedding looked up in a [hidden, vocab] table: the plain copy a tied DualLinear head keeps.

    With it a tied model holds its embedding twice (packed head, plain transposed head) instead of
    three times; the values are the same, so the outputs are unchanged.
    """

    def __init__(self, table_t: torch.Tensor) -> None:
        super().__init__()
        self.table_t = table_t  # [hidden, vocab], shared with the head

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, hidden]
        return self.table_t[:, token_ids].t().contiguous()


def pack_linears(model: NativeTransformer, packing: str = "packed") -> NativeTransformer:
    """Replace every nn.Linear of the model (head included) by a PackedLinear or DualLinear, in place."""
    if packing not in ("packed", "dual"):
        raise ValueError(f"packing must be 'packed' or 'dual', got {packing!r}")
    cls = PackedLinear if packing == "packed" else DualLinear
    if current_packing(model) != "none":
        raise ValueError(f"the model is already packed as {current_packing(model)!r}")
    if not packing_available(model.dtype):
        raise ValueError(f"packing={packing!r}: oneDNN cannot pack {model.dtype} weights on this CPU "
                         "(PyTorch without oneDNN, or bfloat16 without AVX512 / AVX-NE-CONVERT); use packing='none'")
    if model.device.type != "cpu":
        raise ValueError(f"packed linear layers are CPU only; the model is on {model.device}")
    for layer in model.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(layer, name, cls(getattr(layer, name)))
    model.lm_head = cls(model.lm_head)  # a packed copy when tied
    if model.config.tie_word_embeddings and isinstance(model.lm_head, DualLinear) and model.lm_head.transposed:
        model.embed = TransposedEmbedding(model.lm_head.plain)  # the [vocab, hidden] table is freed
    return model


def current_packing(model: NativeTransformer) -> str:
    """'none', 'packed' or 'dual': how the model's linear layers are stored now."""
    if isinstance(model.lm_head, DualLinear):
        return "dual"
    return "packed" if isinstance(model.lm_head, PackedLinear) else "none"


def compiled_forward(model: NativeTransformer, mode: str = "max-autotune-no-cudagraphs", freezing: bool = True):
    """model.forward through torch.compile (inductor); freezing folds the weights in as constants."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = freezing
    return torch.compile(model, mode=mode, dynamic=True)
