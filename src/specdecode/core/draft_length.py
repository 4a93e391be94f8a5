"""Cost-aware draft lengths: each target call drafts the number of tokens that Thm 3.8 says pays most, even 0.

Leviathan et al.'s Thm 3.8, with the measured verification cost instead of the paper's free one: a call
that drafts g tokens costs g * c (the draft, per token, relative to one target step) plus T(g + 1) / T(1)
(the target verifying g + 1 tokens), and yields E(g) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_g tokens, where
a_i is the chance that draft token i is accepted once token i - 1 was. The rate relative to the target
alone is E(g) / (g c + T(g+1)/T(1)); g = 0 is the target alone, rate 1.

`AdaptiveDraftLength` learns a_i and c per draft source (prompt lookup, a draft model) from the calls of
the generation so far, starting from a prior, and picks the g that maximises the rate. A prompt-lookup
draft it did not verify is learned from as well, by comparing it with the tokens the target alone went on
to produce. The choice reads earlier calls only, never the current call's target probabilities, so the output distribution is
untouched: a rejection sampler is exact for any draft length fixed before it runs.
Pure Python: no torch, no model code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["CostProfile", "expected_rate", "best_draft_length", "AdaptiveDraftLength", "default_prior"]


@dataclass(frozen=True)
class CostProfile:
    """Measured verification costs of a target: target_seconds[k] = T(k), the seconds of one call feeding k tokens
    right after a call that fed k too; switch_seconds: what a call costs more when the one before fed another
    number of tokens (llama.cpp reuses its compute graph only for the same shape: about 2 ms here).

    k runs from 1 to the most rows a call may feed (max gamma + 1).
    """

    target_seconds: Mapping[int, float]
    switch_seconds: float = 0.0

    def __post_init__(self) -> None:
        if 1 not in self.target_seconds or any(t <= 0 for t in self.target_seconds.values()):
            raise ValueError(f"target_seconds must hold T(1) and positive times, got {dict(self.target_seconds)}")
        missing = [k for k in range(1, max(self.target_seconds) + 1) if k not in self.target_seconds]
        if missing:
            raise ValueError(f"target_seconds lacks T(k) for k = {missing}")
        if not self.switch_seconds >= 0:
            raise ValueError(f"switch_seconds must be >= 0, got {self.switch_seconds!r}")

    @property
    def max_rows(self) -> int:
        return max(self.target_seconds)

    def verify_ratio(self, rows: int, previous_rows: int | None = None) -> float:
        """T(rows) / T(1), with the switch cost when the call before fed previous_rows != rows (None: no switch)."""
        switch = self.switch_seconds if previous_rows is not None and previous_rows != rows else 0.0
        return (self.target_seconds[rows] + switch) / self.target_seconds[1]

    def to_dict(self) -> dict:
        return {"target_seconds": {str(k): t for k, t in sorted(self.target_seconds.items())},
                "switch_seconds": self.switch_seconds}

    @classmethod
    def from_dict(cls, record: Mapping) -> "CostProfile":
        return cls({int(k): float(t) for k, t in record["target_seconds"].items()}, float(record["switch_seconds"]))


def expected_rate(acceptance: Sequence[float], draft_cost: float, profile: CostProfile, gamma: int,
                  previous_rows: int | None = None) -> float:
    """E(gamma) / (gamma c + T(gamma+1)/T(1)): tokens per T(1) of time; the target alone (gamma 0) gets 1 when
    the call before fed one token too. previous_rows: the tokens the call before fed (see verify_ratio).

    acceptance[i]: the chance that draft token i + 1 is accepted once token i was (at least gamma entries).
    """
    tokens, reach = 1.0, 1.0
    for a in acceptance[:gamma]:
        reach *= a
        tokens += reach
    return tokens / (gamma * draft_cost + profile.verify_ratio(gamma + 1, previous_rows))


def best_draft_length(acceptance: Sequence[float], draft_cost: float, profile: CostProfile, max_gamma: int,
                      previous_rows: int | None = None, margin: float = 0.0) -> int:
    """The g in 0 .. max_gamma with the highest expected_rate (ties: the shorter); 0 when no draft pays, or
    pays less than `margin` (a share of the target alone's rate: room for errors in the estimates)."""
    limit = min(max_gamma, len(acceptance), profile.max_rows - 1)
    rates = [expected_rate(acceptance, draft_cost, profile, g, previous_rows) for g in range(limit + 1)]
    best = max(range(limit + 1), key=lambda g: (rates[g], -g))
    return best if rates[best] >= (1 + margin) * rates[0] else 0


# T(2)/T(1) up to which a wrong draft token costs little (a memory-bound engine: the native one on a CPU, 1.0-1.1)
CHEAP_VERIFICATION = 1.2


def default_prior(profile: CostProfile) -> tuple[float, float]:
    """(prior_alpha, prior_weight) for a source that has not drafted yet. Where verifying a second token is cheap,
    optimistic and weak (0.9, 1): each source drafts at once and long, and one rejection at its first token
    (0.45) shortens it. Where it is not (llama.cpp: T(2)/T(1) 1.36 here), pessimistic (0.5, 2): below what a
    draft token must reach to pay, so a source drafts only once the target alone has shown, unverified, that
    it is right (13 Spec-Bench prompts on llama.cpp: 0.96x the target alone with the optimistic prior and
    without unverified drafts, 1.01x with both; docs/benchmarks/xeon-engines/headline)."""
    cheap = profile.max_rows < 2 or profile.verify_ratio(2) <= CHEAP_VERIFICATION
    return (0.9, 1.0) if cheap else (0.5, 2.0)


@dataclass
class _SourceStats:
    reached: list[float]  # [max_gamma]: draft tokens verified at position i (the earlier ones all accepted)
    accepted: list[float]  # [max_gamma]: ... and accepted there


@dataclass
class AdaptiveDraftLength:
    """Chooses each call's draft length from measured costs and the acceptance seen so far in this generation.

    draft_costs: c of each source that costs anything (a draft model: its seconds per draft token over T(1),
    measured once, so that the choice, and with it a seeded sample, does not change with the machine's noise);
    other sources (prompt lookup) cost 0. prior_alpha, prior_weight: the acceptance a source is assumed to
    have before it has drafted, as prior_weight pseudo-observations at every position; None: `default_prior`.
    A one-hot draft the loop did not verify (`observe_unverified`) is learned from too, so on an engine where
    verification costs (llama.cpp on a CPU) a source need not be tried to be known. margin: a draft must promise
    this much more than the
    target alone (a share of its rate), for the noise in T(k) and in the acceptance estimates. decay: every
    target call weighs the observations so far by this, so a source that stopped paying (a text that did not
    repeat yet) is tried again some 50 calls later, and the estimates follow the text as it changes.
    """

    profile: CostProfile
    max_gamma: int
    draft_costs: Mapping[str, float] = field(default_factory=dict)
    prior_alpha: float | None = None
    prior_weight: float | None = None
    margin: float = 0.1
    decay: float = 0.97
    _stats: dict[str, _SourceStats] = field(default_factory=dict)
    _previous_rows: int | None = None  # the tokens the last target call fed

    def __post_init__(self) -> None:
        if isinstance(self.max_gamma, bool) or not isinstance(self.max_gamma, int) or self.max_gamma < 1:
            raise ValueError(f"max_gamma must be an integer >= 1, got {self.max_gamma!r}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")
        default_alpha, default_weight = default_prior(self.profile)
        self.prior_alpha = default_alpha if self.prior_alpha is None else self.prior_alpha
        self.prior_weight = default_weight if self.prior_weight is None else self.prior_weight
        if not 0 <= self.prior_alpha <= 1:
            raise ValueError(f"prior_alpha must be in [0, 1], got {self.prior_alpha!r}")
        if self.prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight!r}")

    def acceptance(self, source: str) -> list[float]:
        """The estimated a_i of `source` (the prior where it has not drafted that far)."""
        stats = self._stats.get(source)
        w, a = self.prior_weight, self.prior_alpha
        if stats is None:
            return [a] * self.max_gamma
        return [(acc + w * a) / (reached + w) for reached, acc in zip(stats.reached, stats.accepted)]

    def cost(self, source: str) -> float:
        """c of `source`: its draft seconds per draft token over T(1) (0 where none was measured)."""
        return self.draft_costs.get(source, 0.0)

    def best(self, source: str, limit: int, include_draft_cost: bool = True) -> int:
        """The best draft length for `source`, at most `limit`; without the draft cost once the draft is made."""
        cost = self.cost(source) if include_draft_cost else 0.0
        return best_draft_length(self.acceptance(source), cost, self.profile, min(limit, self.max_gamma),
                                 self._previous_rows, self.margin)

    def proposal_length(self, source: str, limit: int) -> int:
        """How many tokens to ask `source` for: its best draft length, but all of `limit` from a source that costs
        nothing to run once it pays at all (what `keep` cuts before verification is then followed unverified, so
        the longer positions are learned too)."""
        best = self.best(source, limit)
        return limit if best and self.cost(source) == 0 else best

    def budget(self, sources: Sequence[str], limit: int) -> int:
        """How many tokens to ask the drafter for: the most any of its sources would use (0: the target alone)."""
        return max((self.best(s, limit) for s in sources), default=0)

    def called(self, rows: int) -> None:
        """A target call fed `rows` tokens (1: the target alone); observe says so for calls with a draft."""
        self._previous_rows = rows
        self._forget()

    def _forget(self) -> None:
        """Weigh every observation so far by `decay` (once per target call)."""
        if self.decay < 1:
            for stats in self._stats.values():
                stats.reached = [r * self.decay for r in stats.reached]
                stats.accepted = [a * self.decay for a in stats.accepted]

    def keep(self, source: str, drafted: int) -> int:
        """How many of the `drafted` tokens that `source` proposed to verify (the draft's cost is spent by now)."""
        return self.best(source, drafted, include_draft_cost=False) if drafted else 0

    def _source(self, source: str) -> _SourceStats:
        return self._stats.setdefault(source, _SourceStats([0.0] * self.max_gamma, [0.0] * self.max_gamma))

    def observe_unverified(self, source: str, position: int, accepted: bool) -> None:
        """A one-hot draft's token at `position` (0-based, the ones before it right) that the target did not verify,
        because the call kept fewer draft tokens or none: `accepted` says whether the target then produced it. At T = 0 that
        is what verification would have said; at T > 0 it happens with chance p(token), the chance that
        verification accepts a one-hot draft token, so the estimate of a_i stays unbiased. A source learns this
        way what it would have gained without paying for the verification."""
        if not 0 <= position < self.max_gamma:
            raise ValueError(f"position must be in [0, {self.max_gamma}), got {position!r}")
        stats = self._source(source)
        stats.reached[position] += 1
        stats.accepted[position] += bool(accepted)

    def observe(self, source: str, verified: int, accepted: int) -> None:
        """After a call: `verified` draft tokens of `source` went to the target, `accepted` of them were kept."""
        if not 0 <= accepted <= verified <= self.max_gamma:
            raise ValueError(f"need 0 <= accepted ({accepted}) <= verified ({verified}) <= {self.max_gamma}")
        self.called(verified + 1)
        stats = self._source(source)
        for i in range(min(accepted + 1, verified)):
            stats.reached[i] += 1
        for i in range(accepted):
            stats.accepted[i] += 1
