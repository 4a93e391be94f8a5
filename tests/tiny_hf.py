"""Tiny Hugging Face models and tokenizers for tests: random weights, nothing downloaded.

Models are built from configs under a fixed `torch.manual_seed`; tokenizers are
word-level `tokenizers` models over a small vocabulary, wrapped in
`PreTrainedTokenizerFast`. Every model built here has a vocabulary of exactly
`len(tokenizer)` ids (unless asked otherwise), so any tiny model can draft for any other.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIALS = [PAD, EOS, UNK]  # ids 0, 1, 2 (T5's own convention: pad 0 = decoder start, eos 1)
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2

# 61 plain words: 64 ids in all with the three specials.
WORDS = (
    "the a an and or of to in on at is was be are it this that with for from by as cat dog bird fish tree "
    "house river stone light dark red blue green quick slow big small runs jumps sleeps eats sees hello world "
    "user assistant system : , . ? ! one two three four five six seven"
).split()
assert len(set(WORDS)) == len(WORDS) == 61
VOCAB_SIZE = len(SPECIALS) + len(WORDS)

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def tiny_tokenizer(
    vocab_words: list[str] | None = None, *, chat_template: str | None = CHAT_TEMPLATE, specials: list[str] = SPECIALS
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: specials first (ids 0..), then vocab_words in order; unknown words map to <unk>."""
    words = list(WORDS if vocab_words is None else vocab_words)
    vocab = {token: i for i, token in enumerate(list(specials) + [w for w in words if w not in specials])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK,
        pad_token=PAD,
        eos_token=EOS,
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def _finish(model: PreTrainedModel, suppress_eos: bool) -> PreTrainedModel:
    """eval mode; with suppress_eos, the EOS logit is always exactly 0 (random logits beat it almost surely)."""
    model.eval()
    if suppress_eos:
        with torch.no_grad():
            model.get_output_embeddings().weight[EOS_ID].zero_()
    # HF generation must not stop or steer on EOS when we compare token for token.
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    return model


def tiny_llama(
    seed: int = 0,
    vocab: int = VOCAB_SIZE,
    layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 256,
    init_range: float = 0.3,
    suppress_eos: bool = True,
) -> LlamaForCausalLM:
    """A random Llama (GQA, RoPE). A large init_range gives peaked logits, so greedy argmaxes are robust to float noise."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_range,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return _finish(LlamaForCausalLM(config), suppress_eos)


def tiny_qwen2(
    seed: int = 0,
    vocab: int = VOCAB_SIZE,
    layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 256,
    init_range: float = 0.3,
    suppress_eos: bool = True,
) -> Qwen2ForCausalLM:
    """A random Qwen2 (q/k/v projections with bias; the biases are randomised too, as init leaves them at 0)."""
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_range,
        use_sliding_window=False,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                assert proj.bias is not None, "Qwen2 attention must have q/k/v bias"
                proj.bias.normal_(0.0, init_range)
    return _finish(model, suppress_eos)


def tiny_t5(
    seed: int = 0,
    vocab: int = VOCAB_SIZE,
    layers: int = 1,
    d_model: int = 32,
    d_ff: int = 64,
    heads: int = 4,
    init_factor: float = 1.0,
    contextual: bool = True,
    suppress_eos: bool = True,
    **extra,
) -> T5ForConditionalGeneration:
    """A random T5 (relative position buckets, cross-attention); decoder_start_token_id = 0 (<pad>).

    T5 always ties its output layer to the input embeddings, so at its own random init
    the decoder mostly predicts its input token again and greedy decoding repeats one
    token forever. contextual=True randomises the decoder's final norm gains and
    strengthens its self-attention output, which gives varied continuations.
    """
    config = T5Config(
        vocab_size=vocab,
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=d_ff,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        dropout_rate=0.0,
        initializer_factor=init_factor,
        feed_forward_proj="relu",
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=PAD_ID,
        **extra,
    )
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(config)
    if contextual:
        with torch.no_grad():
            model.decoder.final_layer_norm.weight.normal_(0.0, 1.0)
            for block in model.decoder.block:
                block.layer[0].SelfAttention.o.weight.mul_(3.0)
    return _finish(model, suppress_eos)


def perturbed_copy(model: PreTrainedModel, seed: int, scale: float) -> PreTrainedModel:
    """A copy of model with every weight moved by scale * (its std) * N(0, 1): a draft that mostly agrees."""
    copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            spread = param.std() if param.numel() > 1 else param.abs()
            param.add_(torch.randn(param.shape, generator=generator) * scale * spread)
    copy.generation_config = model.generation_config
    return copy.eval()


def save_tiny_checkpoint(directory: str | Path, model: PreTrainedModel, tokenizer=None) -> Path:
    """save_pretrained the model (and tokenizer, if any) into directory; return it as a Path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


def save_tiny_eagle_draft(directory: str | Path, hf_target: PreTrainedModel, tokenizer, head_size: int = 40) -> Path:
    """An EAGLE draft directory for hf_target: torch's default initialisation, a head of zeros over its first
    head_size tokens (so q is uniform there: 1 / head_size for every token)."""
    import dataclasses

    from specdecode.drafters.eagle import save_eagle
    from specdecode.native.eagle import EagleNetwork
    from specdecode.native.loading import native_from_hf_model

    config = dataclasses.replace(native_from_hf_model(hf_target, torch.float32).config, num_layers=1,
                                 tie_word_embeddings=False)
    save_eagle(Path(directory), EagleNetwork(config, head_size), torch.arange(head_size), "tiny", tokenizer, {})
    return Path(directory)
