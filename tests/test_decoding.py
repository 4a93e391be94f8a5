"""The decoding loop: edge cases, stopping, streaming, statistics and bad input."""

import pytest
import torch
from mock_models import TableModel

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate, stream
from specdecode.drafters import Draft, ModelDrafter, PromptLookupDrafter

GREEDY = SamplingParams(0.0)
PROMPT = [0, 1]


def plain(target, **kwargs):
    return generate(target, PROMPT, sampling=GREEDY, **kwargs)


def speculative(target, draft_seed=0, gamma=4, **kwargs):
    drafter = ModelDrafter(TableModel(target.vocab_size, draft_seed))
    return generate(target, PROMPT, drafter=drafter, gamma=gamma, sampling=GREEDY, **kwargs)


def test_max_new_tokens_zero_runs_nothing():
    target = TableModel(8, 0)
    result = speculative(target, max_new_tokens=0)
    assert result.token_ids == [] and result.finish_reason == "length"
    assert target.calls == 0 and result.stats.target_calls == 0


def test_max_new_tokens_one_is_the_prefill_token():
    target = TableModel(8, 0)
    result = speculative(target, max_new_tokens=1)
    assert result.token_ids == plain(TableModel(8, 0), max_new_tokens=1).token_ids
    assert result.stats.target_calls == 1 and result.stats.draft_calls == 0


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
@pytest.mark.parametrize("draft_seed", [0, 1])  # 0: draft == target, 1: a different draft
def test_greedy_identity_with_every_gamma(gamma, draft_seed):
    target = TableModel(16, 0)
    expected = plain(target, max_new_tokens=40).token_ids
    assert speculative(target, draft_seed, gamma, max_new_tokens=40).token_ids == expected


def test_greedy_identity_with_a_draft_of_a_wider_vocabulary():
    """A draft model with tokens the target lacks (ids >= its vocabulary): they are rejected, never fed to it."""
    target = TableModel(8, 0)
    wide = TableModel(12, 1)
    wide.table[:8, :8, :8] = target.table  # the target's own choices, except:
    wide.table[:, ::2, 8:] = -float("inf")
    wide.table[:, 1::2, 8] = 10.0  # after an odd token, a token the target lacks
    result = generate(target, PROMPT, drafter=ModelDrafter(wide), gamma=3, max_new_tokens=40, sampling=GREEDY)
    assert result.token_ids == plain(target, max_new_tokens=40).token_ids
    assert 0 < result.stats.rejections and result.stats.accepted_tokens > 0


def test_eos_inside_an_accepted_draft_stops_right_after_it():
    target = TableModel(16, 0)
    free = plain(target, max_new_tokens=30).token_ids
    eos = free[9]  # the draft (== target) proposes it mid-draft
    cut = free.index(eos) + 1
    result = speculative(target, gamma=6, max_new_tokens=30, eos_token_ids={eos})
    assert result.token_ids == free[:cut] and result.finish_reason == "eos"
    assert plain(target, max_new_tokens=30, eos_token_ids={eos}).token_ids == free[:cut]


def test_prompt_near_the_context_limit_stops_when_full():
    target = TableModel(16, 0, max_length=6)  # prompt 2 + 4 fed tokens, and the last one needs no room
    result = speculative(target, gamma=4, max_new_tokens=50)
    expected = plain(TableModel(16, 0, max_length=6), max_new_tokens=50)
    assert result.token_ids == expected.token_ids == plain(TableModel(16, 0), max_new_tokens=5).token_ids
    assert result.finish_reason == expected.finish_reason == "context"


def test_stop_condition_keeps_tokens_up_to_the_stop():
    target = TableModel(16, 0)
    free = plain(target, max_new_tokens=30).token_ids
    stop_at = 13
    result = speculative(target, max_new_tokens=30, stop=lambda ids: stop_at if len(ids) >= stop_at else None)
    assert result.token_ids == free[:stop_at] and result.finish_reason == "stop"


def _stop_after(token: int):
    """Stops right after `token`; fires on a sequence ending with it only, not on its extensions."""
    return lambda ids: len(ids) if ids[-1] == token else None


@pytest.mark.parametrize("prompt", [[0, 1], [0, 2], [3, 1]])
def test_a_stop_condition_firing_inside_an_accepted_draft_stops_there(prompt):
    """The draft is the target itself, so whole drafts are accepted: the condition is asked after each of their
    tokens, as decoding the target alone asks it, not once after the chunk."""
    target = TableModel(4, 0)
    alone = generate(target, prompt, sampling=GREEDY, max_new_tokens=12, stop=_stop_after(3))
    fast = generate(target, prompt, drafter=ModelDrafter(TableModel(4, 0)), gamma=4, sampling=GREEDY,
                    max_new_tokens=12, stop=_stop_after(3))
    assert fast.token_ids == alone.token_ids and fast.finish_reason == alone.finish_reason


def test_sampled_outputs_end_at_the_first_stop():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        result = generate(TableModel(4, 0), PROMPT, drafter=ModelDrafter(TableModel(4, 1)), gamma=4, max_new_tokens=6,
                          sampling=SamplingParams(1.0), stop=_stop_after(3), generator=generator)
        assert 3 not in result.token_ids[:-1]
        assert result.token_ids[-1] == 3 or len(result.token_ids) == 6


def test_stream_yields_chunks_that_add_up():
    target = TableModel(16, 0)
    tokens = stream(target, PROMPT, drafter=ModelDrafter(TableModel(16, 0)), gamma=3, max_new_tokens=17, sampling=GREEDY)
    chunks = list(tokens)
    assert [t for c in chunks for t in c] == tokens.result.token_ids
    assert len(chunks) == tokens.result.stats.target_calls  # one chunk per target call
    assert [len(c) for c in chunks] == [1, 4, 4, 4, 4]


def test_statistics_are_consistent():
    target = TableModel(16, 0)
    result = speculative(target, draft_seed=1, gamma=4, max_new_tokens=60)
    s = result.stats
    assert s.new_tokens == len(result.token_ids) == 60
    assert sum(s.accepted_per_position) == s.accepted_tokens
    assert all(a >= b for a, b in zip(s.accepted_per_position, s.accepted_per_position[1:]))
    assert all(a <= p for a, p in zip(s.accepted_per_position, s.proposed_per_position))
    assert s.alpha == s.accepted_tokens / (s.accepted_tokens + s.rejections)
    assert s.mean_accepted == 60 / s.target_calls
    assert s.target_calls - 1 - s.draft_calls in (0, 1)  # every round asked for a draft but maybe the 1-token last
    assert s.seconds >= s.target_seconds + s.draft_seconds - 1e-9
    assert 0 < s.first_token_seconds < s.seconds
    assert s.decode_tokens_per_s == pytest.approx(59 / (s.seconds - s.first_token_seconds))
    assert set(s.to_dict()) >= {"target_calls", "draft_calls", "mean_accepted", "alpha", "tokens_per_s", "seconds"}


def test_same_seed_same_sample():
    def run(seed):
        g = torch.Generator().manual_seed(seed)
        drafter = ModelDrafter(TableModel(16, 1))
        return generate(TableModel(16, 0), PROMPT, drafter=drafter, gamma=3, max_new_tokens=30,
                        sampling=SamplingParams(1.0), generator=g).token_ids

    assert run(5) == run(5) and run(5) != run(6)


def test_empty_drafts_fall_back_to_plain_steps():
    target = TableModel(16, 0)
    result = generate(target, PROMPT, drafter=PromptLookupDrafter(), gamma=4, max_new_tokens=20, sampling=GREEDY)
    assert result.token_ids == plain(target, max_new_tokens=20).token_ids


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(gamma=0), "gamma"),
        (dict(gamma=-2), "gamma"),
        (dict(gamma=1.5), "gamma"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        stream(TableModel(8, 0), PROMPT, **kwargs)


@pytest.mark.parametrize("prompt", [[], [[0, 1]], [0, 99]])
def test_bad_prompts_are_refused(prompt):
    with pytest.raises(ValueError, match="prompt_ids"):
        stream(TableModel(8, 0), prompt)


def test_drafter_proposing_too_many_tokens_is_an_error():
    class Greedy:
        name = "greedy-liar"

        def start(self, prompt_ids):
            pass

        def propose(self, generated, gamma, sampling, generator):
            return Draft(torch.zeros(gamma + 1, dtype=torch.long))

        def observe(self, draft, num_accepted):
            pass

    with pytest.raises(RuntimeError, match="more than gamma"):
        generate(TableModel(8, 0), PROMPT, drafter=Greedy(), gamma=2, max_new_tokens=10, sampling=GREEDY)
