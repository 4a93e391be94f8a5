"""Draft lengths inside a batch: what a sequence's draft tokens cost when its rows share a pass with others.

A pass over R rows of B sequences takes P(R) seconds (measured, `PassCosts`). For one sequence of the batch, the
target alone is its share of a pass, s = P(R_o + 1) / B (R_o: the other sequences' rows), and g draft tokens
cost the rows they add, P(R_o + 1 + g) - P(R_o + 1), plus the drafting. A draft token pays when its expected
extra tokens per extra second beat the batch's tokens per second, which with the share is Thm 3.8's test
(`core.draft_length`) on the profile T(k) = s + P(R_o + k) - P(R_o + 1), draft cost c * T1 / s. At B = 1 that is
the sequence's own profile; at a large B, s is small, so only cheap rows and drafts that are nearly always right
still pay. Pure Python: no torch, no model code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from specdecode.core.draft_length import AdaptiveDraftLength, CostProfile

__all__ = ["PassCosts", "share_profile", "SharedPassDraftLength"]


@dataclass(frozen=True)
class PassCosts:
    """Seconds of one pass by the rows it feeds, measured at some row counts (1 among them), linear in between
    and beyond the last two."""

    seconds: Mapping[int, float]

    def __post_init__(self) -> None:
        if 1 not in self.seconds or any(rows < 1 or t <= 0 for rows, t in self.seconds.items()):
            raise ValueError(f"seconds must hold P(1) and positive times at rows >= 1, got {dict(self.seconds)}")

    def at(self, rows: int) -> float:
        """P(rows), interpolated."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        known = sorted(self.seconds)
        if rows in self.seconds:
            return self.seconds[rows]
        if len(known) == 1:
            return self.seconds[1] * rows
        below = [r for r in known if r < rows]
        above = [r for r in known if r > rows]
        low, high = (below[-1], above[0]) if above else (known[-2], known[-1])
        slope = (self.seconds[high] - self.seconds[low]) / (high - low)
        return self.seconds[low] + slope * (rows - low)

    def to_dict(self) -> dict:
        return {"seconds": {str(k): t for k, t in sorted(self.seconds.items())}}

    @classmethod
    def from_dict(cls, record: Mapping) -> "PassCosts":
        return cls({int(k): float(t) for k, t in record["seconds"].items()})


def share_profile(costs: PassCosts, sequences: int, other_rows: int, max_rows: int) -> CostProfile:
    """The profile one of `sequences` sequences sees when the others feed `other_rows` rows in the same pass."""
    if sequences < 1 or other_rows < 0:
        raise ValueError(f"need sequences >= 1 and other_rows >= 0, got {sequences} and {other_rows}")
    alone = costs.at(other_rows + 1)
    share = alone / sequences
    return CostProfile({k: share + costs.at(other_rows + k) - alone for k in range(1, max_rows + 1)})


@dataclass
class SharedPassDraftLength(AdaptiveDraftLength):
    """`AdaptiveDraftLength` for a sequence of a batch: before each choice its profile becomes the sequence's
    share of a pass (`share_profile`) at the batch as it is now, and each draft cost c (measured against the
    single-sequence T(1), `single_t1`) is rescaled to that share.

    batch_state: () -> (sequences in the batch, rows the other sequences fed in their last pass).
    """

    costs: PassCosts | None = None
    batch_state: Callable[[], tuple[int, int]] | None = None
    single_t1: float = 0.0
    _single_draft_costs: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if self.costs is None or self.batch_state is None or not self.single_t1 > 0:
            raise ValueError("SharedPassDraftLength needs costs, batch_state and single_t1 > 0")
        self._single_draft_costs = dict(self.draft_costs)
        super().__post_init__()

    def budget(self, sources, limit: int) -> int:
        sequences, other_rows = self.batch_state()
        self.profile = share_profile(self.costs, sequences, other_rows, self.max_gamma + 1)
        share = self.profile.target_seconds[1]
        self.draft_costs = {s: c * self.single_t1 / share for s, c in self._single_draft_costs.items()}
        return super().budget(sources, limit)
