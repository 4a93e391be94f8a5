"""Spec-Bench-style question records ({"question_id", "category", "turns": [...]}): their first turn."""

from __future__ import annotations

__all__ = ["first_turn"]


def first_turn(record: object) -> str:
    """The first turn of a question record, a non-empty string; a ValueError saying what is wrong otherwise."""
    turns = record.get("turns") if isinstance(record, dict) else None
    if not isinstance(turns, list) or not turns:
        raise ValueError("it has no 'turns' list")
    if not isinstance(turns[0], str) or not turns[0].strip():
        raise ValueError("its first turn is not a non-empty string")
    return turns[0]
