"""Spec-Bench-style question files (JSONL of {"question_id", "category", "turns": [...]}) and their first turns."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

__all__ = ["first_turn", "jsonl_lines", "read_questions"]


def first_turn(record: object) -> str:
    """The first turn of a question record, a non-empty string; a ValueError saying what is wrong otherwise."""
    turns = record.get("turns") if isinstance(record, dict) else None
    if not isinstance(turns, list) or not turns:
        raise ValueError("it has no 'turns' list")
    if not isinstance(turns[0], str) or not turns[0].strip():
        raise ValueError("its first turn is not a non-empty string")
    return turns[0]


def jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of each non-blank line of a text file, gunzipped if its name ends in .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, line


def read_questions(path: Path) -> list[tuple[int, dict, str]]:
    """(line number, record, first turn) of each question of a JSONL file (gzipped if it ends in .gz).

    Blank lines are skipped. A ValueError names the first line that is not a question, or says
    that the file is missing or holds none; callers prefix it with their parameter's name.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} not found")
    questions = []
    for number, line in jsonl_lines(path):
        try:
            record = json.loads(line)
            turn = first_turn(record)
        except ValueError as error:  # json's errors too
            raise ValueError(f"line {number} of {path} is not a Spec-Bench question with 'turns' ({error})") from error
        questions.append((number, record, turn))
    if not questions:
        raise ValueError(f"{path} holds no questions")
    return questions
