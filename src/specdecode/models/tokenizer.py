"""`LeanTokenizer`: a saved Hugging Face fast tokenizer read with `tokenizers` and `jinja2` alone.

transformers' tokenizer classes cost 1.5-3 s of imports on a 2-core CPU (its package init and
the lazy-module scan behind `AutoTokenizer`), more than half of the time to the first token of
the native engine. For tokenizer files that transformers itself saved in the generic fast
format (`tokenizer.json` + `tokenizer_config.json` with class `TokenizersBackend` or
`PreTrainedTokenizerFast`: the converted GGUF tokenizer in the model cache and the distilled
drafts), the work is all in `tokenizers` (encode/decode, special tokens, post-processor) and
`jinja2` (chat template, in the same sandbox with the same options and helpers as transformers),
so this class does the same without transformers. `load_saved_tokenizer` picks it for such a
directory and `AutoTokenizer` for anything else; a test checks token-for-token parity with
transformers on the default model's tokenizer.

It offers what specdecode uses of a transformers tokenizer: `__call__`, `encode`, `decode`,
`apply_chat_template`, `get_vocab`, `save_pretrained`, the special tokens and their ids.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

__all__ = ["LeanTokenizer", "load_saved_tokenizer", "lean_tokenizer_supported"]

_GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def _generic_config(directory: Path) -> dict | None:
    """tokenizer_config.json of a generic fast tokenizer that `LeanTokenizer` reads exactly like transformers, else None."""
    config_path = directory / "tokenizer_config.json"
    if not (directory / "tokenizer.json").is_file() or not config_path.is_file():
        return None
    config = json.loads(config_path.read_text(encoding="utf-8"))
    supported = (
        config.get("tokenizer_class") in _GENERIC_CLASSES
        and isinstance(config.get("chat_template", ""), str)  # not a list of named templates
        and not (directory / "additional_chat_templates").exists()
        and not config.get("clean_up_tokenization_spaces", False)  # a decode step transformers adds
        and not config.get("add_prefix_space")  # transformers may rewrite the pre-tokenizer for these
        and "add_bos_token" not in config  # ... and the post-processor for these
        and "add_eos_token" not in config
    )
    return config if supported else None


def lean_tokenizer_supported(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds a generic fast tokenizer that `LeanTokenizer` reads exactly like transformers."""
    return _generic_config(Path(directory)) is not None


def load_saved_tokenizer(directory: str | os.PathLike):
    """The tokenizer saved in `directory`: a `LeanTokenizer` where it reads it exactly, else transformers'."""
    if lean_tokenizer_supported(directory):
        return LeanTokenizer(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"unexpected special token entry in tokenizer_config.json: {value!r}")


@functools.cache
def _template_environment():
    """jinja2's immutable sandbox with transformers' chat-template options and helpers."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # like transformers: no HTML escaping, json.dumps options exposed
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    return environment


@functools.lru_cache(maxsize=8)
def _compiled_template(source: str):
    return _template_environment().from_string(source)


class LeanTokenizer:
    """A generic Hugging Face fast tokenizer from its saved files, without importing transformers."""

    def __init__(self, directory: str | os.PathLike) -> None:
        from tokenizers import Tokenizer

        self.directory = Path(directory)
        config = _generic_config(self.directory)
        if config is None:
            raise ValueError(f"{self.directory} does not hold a generic fast tokenizer; use load_saved_tokenizer")
        self._tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        self._tokenizer.no_truncation()  # as transformers: a saved truncation or padding applies only when asked for
        self._tokenizer.no_padding()
        self.init_kwargs = config
        template_file = self.directory / "chat_template.jinja"
        self.chat_template: str | None = (
            template_file.read_text(encoding="utf-8") if template_file.is_file() else self.init_kwargs.get("chat_template")
        )
        self.special_tokens_map: dict[str, str] = {}
        for name in _SPECIAL_TOKENS:
            text = _token_text(self.init_kwargs.get(name))
            if text is not None:
                self.special_tokens_map[name] = text
            setattr(self, name, text)
            setattr(self, f"{name}_id", None if text is None else self._tokenizer.token_to_id(text))

    def __repr__(self) -> str:
        return f"LeanTokenizer({str(self.directory)!r}, vocab_size={len(self)})"

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else [int(t) for t in token_ids]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str | None]:
        return [self._tokenizer.id_to_token(int(t)) for t in token_ids]

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping],
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **template_kwargs,
    ):
        """Render one conversation with the chat template (and tokenize it, without adding special tokens).

        Returns the text (tokenize=False), {"input_ids", "attention_mask"} (return_dict, transformers 5's
        default) or the ids.
        """
        if not self.chat_template:
            raise ValueError(f"the tokenizer in {self.directory} has no chat template")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        for message in conversation:
            if not isinstance(message, Mapping):
                raise TypeError(f"chat messages must be dicts, got {message!r}")
        # as transformers, keys whose value is None are dropped ("name": null from OpenAI-style clients)
        messages = [{key: value for key, value in message.items() if value is not None} for message in conversation]
        text = _compiled_template(self.chat_template).render(  # the variables transformers passes
            messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **template_kwargs},
        )
        if not tokenize:
            return text
        encoded = self(text, add_special_tokens=False)
        return encoded if return_dict else encoded["input_ids"]

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Copy the tokenizer files to `directory` (what transformers' save_pretrained wrote)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in _FILES:
            if (self.directory / name).is_file():
                shutil.copyfile(self.directory / name, directory / name)
