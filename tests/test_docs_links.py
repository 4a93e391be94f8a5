"""Every link in the docs leads to a file, and every repository path a current page names exists, so the results
file a number cites can be opened."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the pages people read; the report.md files the benches wrote under docs/benchmarks/ are records, left as written
PAGES = sorted(str(p.relative_to(ROOT)) for pattern in ("README.md", "docs/*.md", "docs/history/**/*.md", "scripts/README.md")
               for p in ROOT.glob(pattern))
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:docs|scripts|src|tests)/[^`\s*]+)`")


def _targets(page: str) -> list[tuple[str, Path]]:
    text, here = (ROOT / page).read_text(), (ROOT / page).parent
    found = []
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link) or link.startswith("#"):
            continue
        found.append((link, here / link.split("#")[0]))
    if not page.startswith("docs/history/"):  # a dated record names files as they were then
        found += [(path, ROOT / path.split("::")[0].rstrip("/")) for path in CODE_PATH.findall(text)]
    return found


@pytest.mark.parametrize("page", PAGES)
def test_every_linked_file_and_named_repository_path_exists(page):
    missing = [link for link, target in _targets(page) if not target.exists()]
    assert not missing, f"{page} names files that do not exist: {missing}"


def test_the_pages_are_found():
    assert {"README.md", "docs/benchmarks.md", "docs/native-engine.md", "docs/history/README.md"} <= set(PAGES)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES)
def test_every_link_to_a_section_finds_its_heading(page):
    here = (ROOT / page).parent
    broken = []
    for link in LINK.findall((ROOT / page).read_text()):
        if re.match(r"[a-z]+:", link) or "#" not in link:
            continue
        path, anchor = link.split("#", 1)
        target = here / path if path else ROOT / page
        if target.suffix == ".md" and target.is_file() and anchor not in _anchors(target):
            broken.append(link)
    assert not broken, f"{page} links to sections that do not exist: {broken}"
