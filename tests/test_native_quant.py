"""Weight-only int8 in the native engine: the quantized linear, model agreement with float32, options and errors.

Tiny random models only (the real model's agreement is in `python -m specdecode.native.bench`).
Hidden sizes are multiples of 64 so that the CPU int8 kernel runs where torch has it; a model
with hidden size 32 takes the dequantizing fallback.
"""

from __future__ import annotations

import pytest
import torch
from native_helpers import tiny_llama_variant, write_tiny_gguf
from tiny_hf import VOCAB_SIZE

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters import ModelDrafter
from specdecode.native.engine import NativeLM
from specdecode.native.loading import load_native, native_from_hf_model
from specdecode.native.quant import (
    Int8Embedding,
    Int8Linear,
    int8_kernel_available,
    quantize_model,
    quantize_per_channel,
)

GREEDY = SamplingParams(0.0)
# hidden 64, MLP 128, 4 heads of 16 (2 key/value heads): every matmul has in_features % 64 == 0
KERNEL_SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
TARGET = tiny_llama_variant(seed=21, init_range=0.1, **KERNEL_SIZES)
TIED = tiny_llama_variant(seed=22, init_range=0.1, tie_word_embeddings=True, attention_bias=True, **KERNEL_SIZES)
SMALL = tiny_llama_variant(seed=23, init_range=0.1)  # hidden 32: the fallback path


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))


def engine(hf_model, **options) -> NativeLM:
    return NativeLM(native_from_hf_model(hf_model), max_cache_len=256, **options)


def sequences(count: int = 4, length: int = 48) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(3, VOCAB_SIZE, (length,), generator=generator) for _ in range(count)]


def all_logits(model: NativeLM, sequence: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits at every position [L, V]: one prefill token, then one extend."""
    return torch.cat([model.prefill(sequence[:1])[None], model.extend(sequence[1:])])


def top1_agreement(model: NativeLM, reference: NativeLM) -> float:
    same = total = 0
    for seq in sequences():
        same += int((all_logits(model, seq).argmax(-1) == all_logits(reference, seq).argmax(-1)).sum())
        total += len(seq)
    return same / total


# --------------------------------------------------------------------------- the pieces


def test_per_channel_quantization_is_symmetric_and_close() -> None:
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3, 48)[:, None]
    weight[7] = 0.0
    q, scales = quantize_per_channel(weight)
    assert q.dtype == torch.int8 and q.shape == weight.shape and scales.shape == (48,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert torch.equal(q[7], torch.zeros(64, dtype=torch.int8))  # an all-zero row stays zero (scale 1)
    error = (q.float() * scales[:, None] - weight).abs()
    assert bool((error <= scales[:, None] / 2 + 1e-7).all())  # round to nearest: at most half a step


@pytest.mark.parametrize("in_features, bias", [(64, False), (128, True), (48, True)])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_int8_linear_matches_a_dequantized_matmul(in_features: int, bias: bool, rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(in_features, 96, bias=bias)
    with torch.no_grad():
        linear.weight.normal_(0, 0.2, generator=generator)
        if bias:
            linear.bias.normal_(0, 0.2, generator=generator)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(rows, in_features, generator=generator)
    expected = x @ layer.dequantized().t() + (linear.bias.detach() if bias else 0)
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (rows, 96)
    if layer.uses_kernel:  # bfloat16 activations, float32 accumulation
        tolerance = 1e-2 * float(expected.abs().max())
    else:
        tolerance = 1e-5
    assert float((out - expected).abs().max()) <= tolerance
    assert layer.uses_kernel == (in_features % 64 == 0 and int8_kernel_available())
    # and the dequantized weight is the float one up to half a quantization step
    assert float((layer.dequantized() - linear.weight.detach()).abs().max()) <= float(layer.scales.max()) / 2 + 1e-7


def test_the_kernel_is_used_on_cpu_when_torch_has_it() -> None:
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        pytest.skip("this torch has no _weight_int8pack_mm")
    assert int8_kernel_available()  # torch 2.13 on x86: present and passes the self-check


def test_quantized_model_holds_int8_weights_and_shares_the_tied_table() -> None:
    model = quantize_model(native_from_hf_model(TIED), "int8")
    assert isinstance(model.lm_head, Int8Linear) and isinstance(model.embed, Int8Embedding)
    assert model.embed.qweight is model.lm_head.qweight  # tied: one int8 table
    assert all(isinstance(getattr(layer, name), Int8Linear) for layer in model.layers
               for name in ("qkv", "o", "gate_up", "down"))
    assert model.layers[0].qkv.bias is not None  # biases are kept in float
    fp32 = native_from_hf_model(TIED)
    size = {id(t): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    fp32_size = {id(t): t.numel() * t.element_size() for t in fp32.parameters()}
    assert sum(size.values()) < 0.35 * sum(fp32_size.values())


def test_a_model_with_an_int8_embedding_keeps_it_when_quantized() -> None:
    """A draft cut from its target stores an int8 embedding: quantizing the rest keeps that table as it is."""
    model = native_from_hf_model(TARGET)
    embedding = Int8Embedding(*quantize_per_channel(model.embed.weight), model.dtype)
    model.embed = embedding
    quantize_model(model, "int8")
    assert model.embed is embedding and isinstance(model.lm_head, Int8Linear)


# --------------------------------------------------------------------------- agreement with float32


@pytest.mark.parametrize("hf_model", [TARGET, TIED, SMALL], ids=["kernel", "tied", "fallback"])
def test_int8_top1_agreement_with_float32_is_high(hf_model) -> None:
    reference = engine(hf_model, packing="none")
    int8 = engine(hf_model, quantize="int8")
    assert (int8.quantize, int8.packing) == ("int8", "none")
    agreement = top1_agreement(int8, reference)
    assert agreement >= 0.9, agreement  # 0.97-0.98 here; int8 rounding flips near-ties of random weights
    logits, expected = all_logits(int8, sequences()[0]), all_logits(reference, sequences()[0])
    assert float((logits - expected).abs().max()) < 0.05 * float(expected.abs().max())


def test_int8_incremental_logits_match_one_pass() -> None:
    """Rows fed one at a time or together give the same logits (what exact speculative decoding needs)."""
    model = engine(TARGET, quantize="int8")
    seq = sequences()[1]
    together = all_logits(model, seq)
    model.prefill(seq[:1])
    one_by_one = torch.cat([model.extend(seq[i : i + 1]) for i in range(1, len(seq))])
    assert torch.allclose(together[1:], one_by_one, atol=1e-2, rtol=0)


def test_int8_speculative_greedy_equals_plain_greedy() -> None:
    target, prompt = engine(TARGET, quantize="int8"), sequences()[2][:10]
    plain = generate(target, prompt, max_new_tokens=30, sampling=GREEDY)
    draft = engine(tiny_llama_variant(seed=30, init_range=0.1, **KERNEL_SIZES), quantize="int8")
    spec = generate(engine(TARGET, quantize="int8"), prompt, drafter=ModelDrafter(draft), gamma=4,
                    max_new_tokens=30, sampling=GREEDY)
    assert spec.token_ids == plain.token_ids


def test_load_native_quantizes_a_gguf_model(tmp_path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", TARGET, "llama")
    loaded = load_native(path, max_cache_len=128, quantize="int8")
    assert loaded.model.quantize == "int8" and isinstance(loaded.model.model.lm_head, Int8Linear)
    reference = load_native(path, max_cache_len=128)
    assert reference.model.quantize == "none"
    assert top1_agreement(loaded.model, reference.model) >= 0.9


# --------------------------------------------------------------------------- bad options


def test_bad_quantize_options_raise_value_errors_naming_the_parameter(tmp_path) -> None:
    with pytest.raises(ValueError, match="quantize must be one of 'none', 'int8', got 'int4'"):
        engine(TARGET, quantize="int4")
    with pytest.raises(ValueError, match="quantize"):  # checked before anything is read from disk
        load_native(tmp_path / "missing.gguf", quantize="fp8")
    with pytest.raises(ValueError, match="packing='dual' does not apply to quantize='int8'"):
        engine(TARGET, quantize="int8", packing="dual")
    model = native_from_hf_model(TARGET)
    NativeLM(model, packing="packed")
    with pytest.raises(ValueError, match="packed"):  # a packed model cannot be quantized afterwards
        NativeLM(model, quantize="int8")
    quantized = native_from_hf_model(TARGET)
    assert NativeLM(quantized, quantize="int8").quantize == "int8"
    assert NativeLM(quantized).quantize == "int8"  # the default keeps what is there
    with pytest.raises(ValueError, match="packing='packed' does not apply to an int8 model"):
        NativeLM(quantized, packing="packed")
    with pytest.raises(ValueError, match="2-D"):
        quantize_per_channel(torch.ones(3))
