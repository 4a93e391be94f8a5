"""The teacher-forced acceptance table that scripts/spec_bench_alpha.py writes (alpha*.md) and the docs generate."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["alpha_table"]


def alpha_table(results: Mapping[str, Mapping[str, Mapping]], *deeper: Mapping[str, Mapping[str, Mapping]]) -> str:
    """Markdown: one row per category (sorted, then all), alpha T=0 / T=1 for each draft, from
    {draft: {category | 'all': {alpha_greedy, alpha_t1, positions}}}; then, for each of `deeper` (the same at
    draft tokens 2, 3, ...), its 'all' row."""
    drafts = list(results)
    categories = sorted(c for c in next(iter(results.values())) if c != "all") + ["all"]
    lines = ["| category | positions | " + " | ".join(f"{d} α T=0 | α T=1" for d in drafts) + " |",
             "|---|---|" + "---|---|" * len(drafts)]

    def row(label: str, per_draft: Mapping[str, Mapping[str, Mapping]], category: str) -> str:
        if list(per_draft) != drafts:
            raise ValueError(f"every depth must score the same drafts {drafts}, got {list(per_draft)}")
        cells = [f"{per_draft[d][category]['alpha_greedy']:.3f} | {per_draft[d][category]['alpha_t1']:.3f}"
                 for d in drafts]
        return f"| {label} | {per_draft[drafts[0]][category]['positions']} | " + " | ".join(cells) + " |"

    lines += [row(category, results, category) for category in categories]
    lines += [row(f"all, draft token {depth} (the ones before it accepted)", scores, "all")
              for depth, scores in enumerate(deeper, start=2)]
    return "\n".join(lines)
