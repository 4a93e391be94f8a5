"""The decoding loop: prefill, propose, verify, roll back, accept. Token ids only.

This is the one module that knows both models and drafters. With no drafter (or
gamma 0) the same loop is plain autoregressive decoding of the target, which is
the baseline every speedup is measured against.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch

from specdecode.core.draft_length import AdaptiveDraftLength
from specdecode.core.sampling import SamplingParams, probabilities, sample
from specdecode.core.verification import verify, verify_greedy
from specdecode.drafters.base import Draft, Drafter, draft_sources
from specdecode.models.base import LanguageModel

__all__ = ["GenerationStats", "GenerationResult", "TokenStream", "StopCondition", "stream", "generate", "check_gamma"]

# Given all generated ids, return None to go on, or how many of them to keep and stop. It is asked after every
# token, also inside an accepted draft, so a condition that fires on a prefix only stops there too.
StopCondition = Callable[[Sequence[int]], int | None]


@dataclass
class GenerationStats:
    """Counters of one generation. Times are wall-clock seconds."""

    gamma: int = 0
    new_tokens: int = 0
    target_calls: int = 0  # target forward passes, prefill included
    draft_calls: int = 0  # proposals asked of the drafter
    draft_tokens: int = 0  # tokens proposed in all
    accepted_tokens: int = 0  # draft tokens the target kept
    rejections: int = 0  # proposals that ended in a rejection
    proposed_per_position: list[int] = field(default_factory=list)  # [gamma]: draft tokens that reached position i
    accepted_per_position: list[int] = field(default_factory=list)  # [gamma]: ... and were accepted there
    draft_lengths: dict[int, int] = field(default_factory=dict)  # draft tokens verified -> target calls (after the prefill)
    seconds: float = 0.0
    first_token_seconds: float = 0.0  # until the first new token: the prefills of target and draft
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    draft_start_seconds: float = 0.0  # of draft_seconds: the drafter's start (a draft model's prefill)

    @property
    def alpha(self) -> float | None:
        """Empirical acceptance rate: accepted / (accepted + rejected) draft tokens.

        Tokens after the first rejection are never evaluated, so they do not count.
        None when no draft token was ever evaluated.
        """
        evaluated = self.accepted_tokens + self.rejections
        return self.accepted_tokens / evaluated if evaluated else None

    @property
    def mean_accepted(self) -> float:
        """Tokens produced per target call (the paper's 'tokens per iteration')."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first over the time after it: the decoding rate without the prefills."""
        decoding = self.seconds - self.first_token_seconds
        return (self.new_tokens - 1) / decoding if self.new_tokens > 1 and decoding > 0 else 0.0

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.seconds - self.target_seconds - self.draft_seconds)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            alpha=self.alpha,
            mean_accepted=self.mean_accepted,
            tokens_per_s=self.tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            overhead_seconds=self.overhead_seconds,
        )
        return out


@dataclass
class GenerationResult:
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str  # "eos", "stop", "length" (max_new_tokens) or "context" (context window full)


class TokenStream:
    """Iterate to receive accepted tokens chunk by chunk; `result` is set once exhausted."""

    def __init__(self, loop: Generator[list[int], None, GenerationResult]) -> None:
        self._loop = loop
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[list[int]]:
        self.result = yield from self._loop

    def run(self) -> GenerationResult:
        """Consume the stream and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result


def check_gamma(gamma: int) -> int:
    """gamma itself, or a ValueError naming the parameter: draft tokens per target call, an integer >= 1."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    return gamma


def stream(
    target: LanguageModel,
    prompt_ids: torch.Tensor | Sequence[int],
    *,
    drafter: Drafter | None = None,
    gamma: int = 4,
    max_new_tokens: int = 128,
    sampling: SamplingParams = SamplingParams(),
    eos_token_ids: Collection[int] = (),
    stop: StopCondition | None = None,
    generator: torch.Generator | None = None,
    draft_length: AdaptiveDraftLength | None = None,
) -> TokenStream:
    """Speculative decoding of prompt_ids [P] with `target`, drafting with `drafter`.

    With drafter=None the loop decodes the target alone. draft_length: choose each call's draft length
    (at most gamma, possibly 0) from measured costs and the acceptance of earlier calls
    (`core.draft_length`); None drafts up to gamma every call. Validation happens here, before anything
    runs, so bad arguments fail at the call.
    """
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long)
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt_ids must be a non-empty 1-D sequence of token ids, got shape {tuple(prompt.shape)}")
    check_gamma(gamma)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    if int(prompt.min()) < 0 or int(prompt.max()) >= target.vocab_size:
        raise ValueError(f"prompt_ids must lie in [0, {target.vocab_size}) (the target's vocabulary)")
    if draft_length is not None and draft_length.max_gamma < gamma:
        raise ValueError(f"draft_length chooses up to {draft_length.max_gamma} tokens, fewer than gamma = {gamma}")
    return TokenStream(_loop(target, prompt, drafter, gamma, max_new_tokens, sampling, frozenset(eos_token_ids), stop,
                             generator, draft_length))


def generate(target: LanguageModel, prompt_ids: torch.Tensor | Sequence[int], **kwargs) -> GenerationResult:
    """`stream(...)` run to the end."""
    return stream(target, prompt_ids, **kwargs).run()


class _Clock:
    """Accumulates the wall time of the blocks it times."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.seconds += time.perf_counter() - self._start


def _loop(
    target: LanguageModel,
    prompt: torch.Tensor,
    drafter: Drafter | None,
    gamma: int,
    max_new_tokens: int,
    sampling: SamplingParams,
    eos: frozenset[int],
    stop: StopCondition | None,
    generator: torch.Generator | None,
    draft_length: AdaptiveDraftLength | None,
) -> Generator[list[int], None, GenerationResult]:
    start = time.perf_counter()
    stats = GenerationStats(gamma=gamma if drafter else 0)
    stats.proposed_per_position = [0] * stats.gamma
    stats.accepted_per_position = [0] * stats.gamma
    target_clock, draft_clock = _Clock(), _Clock()
    generated: list[int] = []
    unverified: _UnverifiedDraft | None = None  # a one-hot draft's unverified rest, followed (cost-aware only)

    def finish(reason: str) -> GenerationResult:
        stats.new_tokens = len(generated)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds, stats.draft_seconds = target_clock.seconds, draft_clock.seconds
        return GenerationResult(generated, stats, reason)

    if max_new_tokens == 0:
        return finish("length")

    with target_clock:
        logits = target.prefill(prompt)  # [V]
    stats.target_calls += 1
    first = int(logits.argmax()) if sampling.greedy else int(sample(probabilities(logits, sampling), generator))
    if drafter is not None and max_new_tokens > 1:  # a single token never needs a draft
        with draft_clock:
            drafter.start(prompt)
        stats.draft_start_seconds = draft_clock.seconds

    new = [first]
    stats.first_token_seconds = time.perf_counter() - start
    while True:
        new, reason = _truncate(generated, new, eos, stop, max_new_tokens)
        generated.extend(new)
        if new:
            yield new
        if reason:
            return finish(reason)
        room = target.room()  # positions left: the last token plus the draft must fit
        if room < 1:
            return finish("context")
        limit = g = min(stats.gamma, max_new_tokens - len(generated) - 1, room - 1)
        if g > 0 and draft_length is not None:
            g = draft_length.budget(draft_sources(drafter), g)  # 0 where no draft length pays
        proposal = draft = Draft.empty()
        if g > 0:
            with draft_clock:
                if draft_length is not None and hasattr(drafter, "propose_within"):  # a budget per source
                    budget = limit
                    proposal = drafter.propose_within(
                        torch.tensor(generated), lambda s: draft_length.proposal_length(s, budget), sampling, generator)
                else:
                    proposal = drafter.propose(torch.tensor(generated), g, sampling, generator)
            stats.draft_calls += 1
            if len(proposal) > limit:
                raise RuntimeError(f"drafter {drafter.name} proposed {len(proposal)} tokens, more than gamma = {limit}")
            draft = proposal
            if draft_length is not None:
                draft = proposal.truncated(draft_length.keep(proposal.source or drafter.name, len(proposal)))
        elif limit > 0 and draft_length is not None and unverified is None:
            with draft_clock:
                proposal = _free_draft(drafter, generated, limit, draft_length, sampling, generator)
        stats.draft_lengths[len(draft)] = stats.draft_lengths.get(len(draft), 0) + 1
        new = _verify_step(target, generated, draft, sampling, generator, target_clock, stats)
        if drafter is not None and g > 0:
            drafter.observe(draft, len(new) - 1)
        if draft_length is None:
            continue
        accepted = len(new) - 1
        if len(draft):
            draft_length.observe(draft.source or drafter.name, len(draft), accepted)
            unverified = None
        else:
            draft_length.called(1)
        # a one-hot proposal cut before verification: the target's next tokens say whether the rest was right
        if unverified is None and accepted == len(draft) < len(proposal) and proposal.probs is None:
            unverified = _UnverifiedDraft(proposal.source or drafter.name, proposal.tokens.tolist(), len(draft))
        if unverified is not None:
            unverified = unverified.follow(new[-1], draft_length)


@dataclass
class _UnverifiedDraft:
    """The part of a one-hot draft (prompt lookup) that the target did not verify, because the cost-aware draft
    length kept less of it: each token the target produces next tells `AdaptiveDraftLength` whether the draft's
    next token would have been accepted, so a source learns what a longer draft would gain without paying for
    its verification."""

    source: str
    tokens: list[int]
    position: int = 0  # the draft token the next target token is compared with

    def follow(self, token: int, draft_length: AdaptiveDraftLength) -> "_UnverifiedDraft | None":
        """Record the target's `token` against the draft; self while the draft still has tokens to compare, else None."""
        hit = token == self.tokens[self.position]
        draft_length.observe_unverified(self.source, self.position, hit)
        self.position += 1
        return self if hit and self.position < len(self.tokens) else None


def _free_draft(drafter: Drafter, generated: list[int], limit: int, draft_length: AdaptiveDraftLength,
                sampling: SamplingParams, generator: torch.Generator | None) -> Draft:
    """A draft of up to `limit` tokens from the drafter's sources that cost nothing to run (prompt lookup), to be
    followed unverified; empty where there is none. Only drafters with `propose_within` (a budget per source) can
    be asked for one without running a draft model."""
    if not hasattr(drafter, "propose_within"):
        return Draft.empty()
    return drafter.propose_within(torch.tensor(generated), lambda s: limit if draft_length.cost(s) == 0 else 0,
                                  sampling, generator)


def _verify_step(
    target: LanguageModel,
    generated: list[int],
    draft: Draft,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    target_clock: _Clock,
    stats: GenerationStats,
) -> list[int]:
    """Run the target once over [last token, draft...], verify, roll back; return the new tokens.

    A draft token outside the target's vocabulary (a draft model with extra tokens) has p = 0, so it is
    rejected for certain: the target reads the draft up to it, and verification stops there.
    """
    outside = (draft.tokens >= target.vocab_size).nonzero()
    read = int(outside[0]) if len(outside) else len(draft)  # the draft tokens before the first outside the vocabulary
    feed = torch.cat([torch.tensor(generated[-1:]), draft.tokens[:read]])
    cached = target.num_generated
    with target_clock:
        logits = target.extend(feed)  # [read + 1, V]
    stats.target_calls += 1
    checked = len(draft)  # the draft tokens verification can reach
    if read < len(draft):  # draft token `read` has p = 0: it is rejected for certain, so verification stops there
        checked = read + 1
        logits = torch.cat([logits, logits[-1:]])  # the bonus row, never read
    tokens, probs = draft.tokens[:checked], None if draft.probs is None else draft.probs[:checked]
    if sampling.greedy:
        outcome = verify_greedy(tokens, logits.argmax(dim=-1))
    else:
        outcome = verify(tokens, probs, probabilities(logits, sampling), generator)
    n = outcome.num_accepted
    target.rollback(cached + 1 + n)  # keep the last token and the accepted draft

    g = len(draft)
    stats.draft_tokens += g
    stats.accepted_tokens += n
    stats.rejections += int(n < g)
    for i in range(min(n + 1, g)):
        stats.proposed_per_position[i] += 1
    for i in range(n):
        stats.accepted_per_position[i] += 1
    return draft.tokens[:n].tolist() + [outcome.next_token]


def _truncate(
    generated: list[int], new: list[int], eos: frozenset[int], stop: StopCondition | None, max_new_tokens: int
) -> tuple[list[int], str | None]:
    """Cut `new` at the first EOS, stop condition or length limit; say why generation ends, if it does."""
    reason = None
    eos_at = next((i for i, token in enumerate(new) if token in eos), None)
    if eos_at is not None:
        new, reason = new[: eos_at + 1], "eos"
    room = max_new_tokens - len(generated)
    if len(new) > room:
        new, reason = new[:room], "length"
    elif len(new) == room and reason is None:
        reason = "length"
    if stop is not None:  # after each token, as decoding the target alone checks it
        for end in range(1, len(new) + 1):
            keep = stop(generated + new[:end])
            if keep is not None:
                return new[: max(0, keep - len(generated))], "stop"
    return new, reason
