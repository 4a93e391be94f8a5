"""What a benchmark run measures: every option with its default, the --quick preset, validation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specdecode.backends import BACKENDS
from specdecode.drafters.base import check_min_confidence
from specdecode.native.config import check_packing
from specdecode.models.loading import DEFAULT_TARGET

__all__ = ["BenchConfig", "STATISTICAL_DRAFTS", "PEERS", "default_drafts", "QUICK"]

STATISTICAL_DRAFTS = ("unigram", "bigram")  # fitted by the bench itself (the paper's Table 3 baselines)
PEERS = ("prompt-lookup", "assisted")  # Hugging Face generate(...) peers; plain generate is their baseline


def default_drafts(target: str = DEFAULT_TARGET, backend: str = "auto") -> tuple[str, ...]:
    """The model draft of the draft `--draft auto` resolves to for the target on `backend` (`pairs.PAIRS`; the
    bench's 'auto' is the native engine, run.py), that draft itself, prompt lookup, unigram and bigram."""
    from specdecode.pipeline import DEFAULT_DRAFT, expected_engine, resolve_draft_name

    auto = resolve_draft_name(DEFAULT_DRAFT, target, expected_engine(backend))
    model = auto.removesuffix("+ngram")
    return _unique((*([model] if model != "ngram" else []), auto, "ngram", *STATISTICAL_DRAFTS))


def _unique(items) -> tuple:
    return tuple(dict.fromkeys(items))


# Sized for the default target (SmolLM2-135M, ~20 tokens/s plain decoding on a 2-core CPU):
# the default run should take ~15 minutes there, --quick ~2 (it logs its own estimate once it knows the speed).
_DEFAULTS = dict(
    max_new_tokens=48,
    per_category=1,
    limit=None,
    gamma=4,
    gammas=(1, 2, 4, 6),
    temperatures=(0.0, 1.0),
    sweep_prompts=2,
    cost_reps=7,
)
QUICK = dict(max_new_tokens=24, per_category=1, limit=3, gamma=4, gammas=(2, 4), temperatures=(0.0, 1.0),
             sweep_prompts=1, cost_reps=3)


@dataclass
class BenchConfig:
    """Options of `specdecode bench`. None means: the default (or the --quick preset's value)."""

    prompts: str
    out: Path
    target: str = DEFAULT_TARGET
    drafts: tuple[str, ...] | None = None  # all swept over gammas; default: default_drafts(target, backend)
    category_drafts: tuple[str, ...] | None = None  # also run on every prompt at `gamma`; default: drafts less unigram/bigram
    backend: str = "auto"
    packing: str = "auto"  # the native target's layout of its linear layers
    gamma: int | None = None  # the gamma of the per-category table and of the peers
    gammas: tuple[int, ...] | None = None  # the sweep (gamma is added to it)
    min_confidence: float | None = None  # a draft model's early end; default: pairs.DEFAULT_MIN_CONFIDENCE
    temperatures: tuple[float, ...] | None = None
    max_new_tokens: int | None = None
    per_category: int | None = None
    categories: tuple[str, ...] | None = None  # only these categories (default: all)
    limit: int | None = None  # at most this many prompts, from evenly spaced categories
    sweep_prompts: int | None = None  # prompts (evenly spaced categories) for the gamma sweep and the peers
    peers: tuple[str, ...] = PEERS
    seed: int = 0
    cost_reps: int | None = None
    threads: int | None = None
    chat: bool | None = None
    quick: bool = False
    command: str = ""  # the command line, for the report

    def resolved(self) -> "BenchConfig":
        """A copy with every None filled in (from QUICK when quick) and the value lists cleaned up; validated."""
        preset = QUICK if self.quick else _DEFAULTS
        values = {k: (preset[k] if getattr(self, k) is None and k in preset else getattr(self, k)) for k in preset}
        drafts = _unique(self.drafts) if self.drafts is not None else default_drafts(self.target, self.backend)
        category = (
            _unique(self.category_drafts)
            if self.category_drafts is not None
            else tuple(d for d in drafts if d not in STATISTICAL_DRAFTS)
        )
        out = replace(self, **values, drafts=drafts, category_drafts=category, out=Path(self.out), peers=_unique(self.peers))
        if out.min_confidence is None:
            from specdecode.pairs import DEFAULT_MIN_CONFIDENCE

            out.min_confidence = DEFAULT_MIN_CONFIDENCE
        out.gammas = tuple(sorted(set(out.gammas) | {out.gamma})) if _ints(out.gammas) and _int(out.gamma) else out.gammas
        out.temperatures = _unique(float(t) for t in out.temperatures) if _reals(out.temperatures) else out.temperatures
        out.validate()
        return out

    def validate(self) -> None:
        """Raise ValueError naming the first bad parameter."""
        if not str(self.prompts).strip():
            raise ValueError("prompts must name a Spec-Bench JSONL file or a built-in task")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        check_packing(self.packing)
        for name in ("gamma", "max_new_tokens", "per_category", "cost_reps"):
            value = getattr(self, name)
            if not _int(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("limit", "threads"):
            value = getattr(self, name)
            if value is not None and (not _int(value) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not _int(self.sweep_prompts) or self.sweep_prompts < 0:
            raise ValueError(f"sweep_prompts must be an integer >= 0, got {self.sweep_prompts!r}")
        if not self.gammas or not _ints(self.gammas) or min(self.gammas) < 1:
            raise ValueError(f"gammas must be integers >= 1, got {self.gammas!r}")
        check_min_confidence(self.min_confidence)
        if not self.temperatures or not _reals(self.temperatures) or any(
            math.isnan(t) or math.isinf(t) or t < 0 for t in self.temperatures
        ):
            raise ValueError(f"temperatures must be finite numbers >= 0, got {self.temperatures!r}")
        if not self.drafts or any(not isinstance(d, str) or not d.strip() for d in self.drafts):
            raise ValueError(f"drafts must be non-empty names, got {self.drafts!r}")
        if "none" in self.drafts or "none" in (self.category_drafts or ()):
            raise ValueError("drafts: 'none' is the target alone, which every comparison measures anyway")
        stray = [d for d in self.category_drafts or () if d not in self.drafts]
        if stray:
            raise ValueError(f"category_drafts must be among drafts ({', '.join(self.drafts)}), got {', '.join(stray)}")
        unknown = [p for p in self.peers if p not in PEERS]
        if unknown:
            raise ValueError(f"peers must be among {', '.join(PEERS)} (or none), got {', '.join(unknown)}")
        if not _int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["out"] = str(self.out)
        return out



def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(values) -> bool:
    return isinstance(values, (tuple, list)) and all(_int(v) for v in values)


def _reals(values) -> bool:
    return isinstance(values, (tuple, list)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
