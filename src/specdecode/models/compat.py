"""Checking up front that a draft can be paired with a target."""

from __future__ import annotations

__all__ = ["IncompatibleVocabularyError", "check_vocabularies"]

# Tokens the draft knows that the target lacks are harmless (the target gives them
# probability 0, so they are always rejected) but a pair sharing less than this
# share of the target's vocabulary is almost surely a mistake.
_MIN_SHARED = 0.99


class IncompatibleVocabularyError(ValueError):
    """The draft and target do not share one token-id mapping."""


def check_vocabularies(target_tokenizer, draft_tokenizer, target_vocab_size: int, draft_vocab_size: int) -> None:
    """Refuse a draft whose token ids mean something else than the target's.

    With both tokenizers: every token both know must have the same id, and the draft
    must know at least 99% of the target's tokens. Without tokenizers, the logit
    widths must match.
    """
    if target_tokenizer is None or draft_tokenizer is None:
        if target_vocab_size != draft_vocab_size:
            raise IncompatibleVocabularyError(
                f"draft: its vocabulary has {draft_vocab_size} entries but the target's has {target_vocab_size} "
                "(and without tokenizers the ids cannot be matched)"
            )
        return
    target_vocab: dict[str, int] = target_tokenizer.get_vocab()
    draft_vocab: dict[str, int] = draft_tokenizer.get_vocab()
    mismatched = [(tok, target_vocab[tok], i) for tok, i in draft_vocab.items() if tok in target_vocab and target_vocab[tok] != i]
    if mismatched:
        examples = ", ".join(f"{tok!r}: target {t} vs draft {d}" for tok, t, d in mismatched[:3])
        raise IncompatibleVocabularyError(
            f"draft: {len(mismatched)} tokens have different ids in the draft and target tokenizers ({examples}); "
            "the draft must share the target's tokenizer"
        )
    shared = sum(1 for tok in target_vocab if tok in draft_vocab)
    if shared < _MIN_SHARED * len(target_vocab):
        raise IncompatibleVocabularyError(
            f"draft: it knows only {shared} of the target's {len(target_vocab)} tokens; "
            "the draft must share the target's tokenizer"
        )
