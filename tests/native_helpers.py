"""Helpers for the native engine's tests: writing tiny GGUF files the way llama.cpp's converter does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from transformers import PreTrainedModel

# transformers name (after model.layers.N.) -> llama.cpp name (after blk.N.)
_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llamacpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: rotate-half q/k rows -> interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )


def gguf_name(hf_name: str) -> str:
    stem, _, kind = hf_name.rpartition(".")
    if stem == "model.embed_tokens":
        return f"token_embd.{kind}"
    if stem == "model.norm":
        return f"output_norm.{kind}"
    if stem == "lm_head":
        return f"output.{kind}"
    _, _, layer, rest = stem.split(".", 3)  # model.layers.N.rest
    return f"blk.{layer}.{_BLOCK[rest]}.{kind}"


def write_tiny_gguf(
    path: str | Path,
    model: PreTrainedModel,
    arch: str = "llama",
    *,
    permute: bool | None = None,
    eos_token_id: int | None = 1,
    extra_tensors: dict[str, np.ndarray] | None = None,
    vocabulary: list[str] | None = None,
) -> Path:
    """Write a Llama/Qwen2 `transformers` model as an F32 GGUF file (llama.cpp layout and metadata).

    q/k weights (and biases) are permuted as llama.cpp does for the 'llama' architecture
    (permute=None: only for arch 'llama'); a tied model gets no output.weight. vocabulary: the tokens, written
    as a SentencePiece-style vocabulary (ids 0-2 control tokens), which llama.cpp needs to load the file.
    """
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    permute = (arch == "llama") if permute is None else permute
    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny-test-model")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(config.hidden_size // heads)
    if config.rope_parameters.get("rope_type", "default") == "linear":
        from gguf import RopeScalingType

        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(config.rope_parameters["factor"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    if eos_token_id is not None:
        writer.add_eos_token_id(eos_token_id)
    if vocabulary is not None:
        from gguf import TokenType

        writer.add_tokenizer_model("llama")
        writer.add_token_list(vocabulary)
        writer.add_token_scores([0.0] * len(vocabulary))
        writer.add_token_types([TokenType.CONTROL if i < 3 else TokenType.NORMAL for i in range(len(vocabulary))])
    tied = bool(config.tie_word_embeddings)
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        data = tensor.detach().float().numpy().copy()
        if permute and ".q_proj." in name:
            data = llamacpp_permute(data, heads, heads)
        elif permute and ".k_proj." in name:
            data = llamacpp_permute(data, heads, kv_heads)
        writer.add_tensor(gguf_name(name), data)
    for name, data in (extra_tensors or {}).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def tiny_llama_variant(seed: int = 0, init_range: float = 0.3, **overrides) -> PreTrainedModel:
    """A tiny random Llama like tiny_hf.tiny_llama, with config fields overridden (RoPE scaling, biases, ...)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny_hf import EOS_ID, PAD_ID, VOCAB_SIZE

    fields = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=init_range,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    fields.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**fields)).eval()
    with torch.no_grad():  # biases start at 0; make them matter
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, init_range)
    return model
