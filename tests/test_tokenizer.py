"""LeanTokenizer reads saved fast tokenizers exactly like transformers, without importing it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from conftest import SHARED_DATA
from specdecode.models.tokenizer import LeanTokenizer, lean_tokenizer_supported, load_saved_tokenizer
from tiny_hf import WORDS, tiny_tokenizer

BOS = "<s>"
TEXTS = ["the quick dog runs", "hello world .", "cat zebra unknown words", "</s> the <pad> end", "", "  a   b  "]
CONVERSATIONS = [
    [{"role": "user", "content": "hello world"}],
    [{"role": "system", "content": "be quick"}, {"role": "user", "content": "the cat"},
     {"role": "assistant", "content": "a dog"}, {"role": "user", "content": "why ?"}],
    [{"role": "user", "content": "is a < b & c ? 'yes' \"no\" été"}],
]


def _saved(tokenizer: PreTrainedTokenizerFast, directory: Path) -> Path:
    tokenizer.save_pretrained(directory)
    return directory


def _bos_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose post-processor prepends <s> (what add_special_tokens toggles)."""
    vocab = {token: i for i, token in enumerate(["<pad>", "</s>", "<unk>", BOS, *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="</s>", bos_token=BOS, clean_up_tokenization_spaces=False)
    # blocks on their own lines (trim_blocks / lstrip_blocks), raise_exception, tojson without HTML escaping
    tokenizer.chat_template = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'system' and not loop.first %}\n"
        "        {{ raise_exception('system must come first') }}\n"
        "    {% endif %}\n"
        "{{ m['role'] }} : {{ m['content'] | trim }}{{ eos_token }}\n"
        "{% endfor %}\n"
        "{% if tools is not none %}{{ raise_exception('no tools were given') }}{% endif %}"
        "{% if add_generation_prompt %}assistant :{% endif %}{{ messages[-1] | tojson }}"
    )
    return tokenizer


@pytest.mark.parametrize("make", [tiny_tokenizer, _bos_tokenizer], ids=["word-level", "with-bos"])
def test_lean_tokenizer_matches_transformers(tmp_path, make) -> None:
    directory = _saved(make(), tmp_path)
    assert lean_tokenizer_supported(directory)
    lean, reference = load_saved_tokenizer(directory), AutoTokenizer.from_pretrained(directory)
    assert isinstance(lean, LeanTokenizer)
    assert len(lean) == len(reference) and lean.get_vocab() == reference.get_vocab()
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(lean, name) == getattr(reference, name), name
        assert getattr(lean, f"{name}_id") == getattr(reference, f"{name}_id"), name
    assert lean.special_tokens_map == reference.special_tokens_map
    for text in TEXTS:
        for special in (True, False):
            assert lean(text, add_special_tokens=special)["input_ids"] == reference(
                text, add_special_tokens=special)["input_ids"], (text, special)
        ids = reference(text)["input_ids"]
        for skip in (True, False):
            assert lean.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    for conversation in CONVERSATIONS:
        for prompt in (True, False):
            ours = lean.apply_chat_template(conversation, add_generation_prompt=prompt)
            theirs = reference.apply_chat_template(conversation, add_generation_prompt=prompt)
            assert ours["input_ids"] == list(theirs["input_ids"])  # a dict by default, as in transformers 5
            assert lean.apply_chat_template(conversation, add_generation_prompt=prompt, return_dict=False) == \
                list(reference.apply_chat_template(conversation, add_generation_prompt=prompt, return_dict=False))
            assert lean.apply_chat_template(conversation, add_generation_prompt=prompt, tokenize=False) == \
                reference.apply_chat_template(conversation, add_generation_prompt=prompt, tokenize=False)


def test_saved_truncation_padding_and_none_valued_keys_as_transformers(tmp_path) -> None:
    """transformers ignores a truncation or padding saved in tokenizer.json unless asked, and drops None-valued
    message keys (an OpenAI-style "name": null) before the template sees them."""
    template = "{% for m in messages %}{{ m['role'] }}{% if m.name is defined %} ( {{ m.name }} ){% endif %} : {{ m['content'] }} {% endfor %}"
    tokenizer = tiny_tokenizer(chat_template=template)
    tokenizer.backend_tokenizer.enable_truncation(max_length=4)
    tokenizer.backend_tokenizer.enable_padding(length=12)
    directory = _saved(tokenizer, tmp_path / "t")
    hf, lean = AutoTokenizer.from_pretrained(directory), LeanTokenizer(directory)
    text = "the cat sees the dog and the bird"
    assert lean.encode(text) == hf.encode(text) and len(hf.encode(text)) > 4
    messages = [{"role": "user", "content": "hello world", "name": None}]
    assert lean.apply_chat_template(messages, tokenize=False) == hf.apply_chat_template(messages, tokenize=False) == "user : hello world "
    for tok in (hf, lean):
        with pytest.raises(ValueError, match="empty conversation"):
            tok.apply_chat_template([], tokenize=False)


def test_chat_template_errors_surface_like_transformers(tmp_path) -> None:
    directory = _saved(_bos_tokenizer(), tmp_path / "bos")
    bad = [{"role": "user", "content": "hello"}, {"role": "system", "content": "late"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="system must come first"):
        LeanTokenizer(directory).apply_chat_template(bad)
    with pytest.raises(jinja2.exceptions.TemplateError, match="system must come first"):
        AutoTokenizer.from_pretrained(directory).apply_chat_template(bad)
    with pytest.raises(TypeError, match="dicts"):
        LeanTokenizer(directory).apply_chat_template(["hello"])
    plain = _saved(tiny_tokenizer(chat_template=None), tmp_path / "plain")
    lean = LeanTokenizer(plain)
    assert lean.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        lean.apply_chat_template(CONVERSATIONS[0])


def test_templates_run_in_jinja_sandbox(tmp_path) -> None:
    tokenizer = tiny_tokenizer(chat_template="{{ messages.__class__.__mro__ }}")
    lean = LeanTokenizer(_saved(tokenizer, tmp_path))
    with pytest.raises(jinja2.exceptions.SecurityError):
        lean.apply_chat_template(CONVERSATIONS[0], tokenize=False)


def test_other_tokenizer_configs_go_to_transformers(tmp_path) -> None:
    directory = _saved(tiny_tokenizer(), tmp_path)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for extra in ({"chat_template": [{"name": "default", "template": "x"}]},  # named templates
                  {"add_bos_token": True}):  # transformers rewrites the post-processor for this
        config_path.write_text(json.dumps({**config, **extra}))
        assert not lean_tokenizer_supported(directory), extra
    assert not isinstance(load_saved_tokenizer(directory), LeanTokenizer)
    with pytest.raises(ValueError, match="generic fast tokenizer"):
        LeanTokenizer(directory)
    assert not lean_tokenizer_supported(tmp_path / "missing")


def test_save_pretrained_copies_the_files(tmp_path) -> None:
    lean = LeanTokenizer(_saved(_bos_tokenizer(), tmp_path / "a"))
    lean.save_pretrained(tmp_path / "b")
    again = load_saved_tokenizer(tmp_path / "b")
    assert isinstance(again, LeanTokenizer) and again.chat_template == lean.chat_template
    assert again("the cat")["input_ids"] == lean("the cat")["input_ids"]


def test_using_a_lean_tokenizer_does_not_import_transformers(tmp_path) -> None:
    directory = _saved(_bos_tokenizer(), tmp_path)
    code = f"""
        import sys
        from specdecode.models.tokenizer import load_saved_tokenizer
        tokenizer = load_saved_tokenizer({str(directory)!r})
        ids = tokenizer.apply_chat_template([{{"role": "user", "content": "the cat"}}], return_dict=False)
        assert tokenizer.decode(ids, skip_special_tokens=True) and type(tokenizer).__name__ == "LeanTokenizer"
        loaded = sorted(m for m in sys.modules if m == "transformers" or m.startswith("transformers."))
        assert not loaded, loaded[:10]
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.real_model
def test_default_model_tokenizer_matches_transformers_on_spec_bench() -> None:
    """The cached tokenizer of the default model (the one `specdecode generate` uses) against transformers'."""
    from specdecode.native.loading import load_native

    load_native()  # converts on first use, so the cache holds the tokenizer afterwards
    again = load_native()
    assert isinstance(again.tokenizer, LeanTokenizer)
    directory = again.tokenizer.directory
    reference = AutoTokenizer.from_pretrained(directory)
    lines = (SHARED_DATA / "spec_bench_dev.jsonl").read_text().splitlines()
    texts = [json.loads(line)["turns"][0] for line in lines[:80]] + ["<|im_start|>user\nhi<|im_end|>", "tabs\tand émoji 🚀", "  spaces  "]
    for text in texts:
        ids = reference(text)["input_ids"]
        assert again.tokenizer(text)["input_ids"] == ids
        assert again.tokenizer.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
        conversation = [{"role": "user", "content": text}]
        assert again.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False) == \
            list(reference.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False))
    assert again.tokenizer.eos_token_id == reference.eos_token_id == 2
