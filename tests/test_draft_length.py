"""Cost-aware draft lengths (`core.draft_length`): Thm 3.8 with measured T(k), and the loop that follows it."""

from __future__ import annotations

import pytest
import torch
from mock_models import TableModel

from specdecode.core.draft_length import AdaptiveDraftLength, CostProfile, best_draft_length, expected_rate
from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters import ModelDrafter, PromptLookupDrafter

FLAT = CostProfile({k: 1.0 for k in range(1, 7)})  # memory-bound: verifying 6 tokens costs one step
LINEAR = CostProfile({k: 0.8 * k + 0.2 for k in range(1, 7)})  # compute-bound: Qwen2.5-1.5B on llama.cpp here
LLAMA_CPP = CostProfile({1: 1.0, 2: 1.36, 3: 1.89, 4: 2.28, 5: 2.77})  # SmolLM2-135M Q4_1 on llama.cpp, 2 cores


def test_expected_rate_is_thm_3_8_with_the_measured_verification_cost():
    # E = 1 + 0.5 + 0.25 tokens for 2 * 0.1 + T(3)/T(1) = 0.2 + 2.6 / 1.0
    assert expected_rate([0.5, 0.5], 0.1, LINEAR, 2) == pytest.approx(1.75 / 2.8)
    assert expected_rate([0.9], 0.0, FLAT, 0) == 1.0


def test_flat_costs_draft_long_and_linear_costs_draft_nothing_unless_nearly_always_right():
    assert best_draft_length([0.8] * 5, 0.02, FLAT, 5) == 5
    assert best_draft_length([0.7] * 5, 0.0, LINEAR, 5) == 0  # 1.7 / 1.8 < 1
    assert best_draft_length([0.95] * 5, 0.0, LINEAR, 5) == 2  # nearly always right: 2.85 / 2.6 beats 5.3 / 5.0
    assert best_draft_length([0.8] * 5, 0.6, FLAT, 5) == 1  # an expensive draft: 1.8 / 1.6 beats 2.44 / 2.2


def test_a_margin_and_a_change_of_shape_make_a_marginal_draft_not_worth_it():
    profile = CostProfile({1: 1.0, 2: 1.5}, switch_seconds=0.1)
    assert best_draft_length([0.56], 0.0, profile, 1) == 1  # 1.56 / 1.5
    assert best_draft_length([0.56], 0.0, profile, 1, margin=0.05) == 0
    assert best_draft_length([0.56], 0.0, profile, 1, previous_rows=1) == 0  # 1.56 / 1.6


def test_the_profile_checks_its_times():
    with pytest.raises(ValueError, match="lacks T\\(k\\) for k = \\[2\\]"):
        CostProfile({1: 1.0, 3: 2.0})
    with pytest.raises(ValueError, match="must hold T\\(1\\)"):
        CostProfile({2: 1.0})
    assert CostProfile.from_dict(LINEAR.to_dict()) == LINEAR


def test_acceptance_is_learned_per_source_from_the_prior():
    policy = AdaptiveDraftLength(FLAT, 4, {"a": 0.3, "b": 0.3}, prior_alpha=0.95, prior_weight=1.0, margin=0.0, decay=1.0)
    assert policy.budget(["a", "b"], 4) == 4
    for _ in range(5):
        policy.observe("a", 4, 0)  # always rejected at once
    assert policy.acceptance("a")[0] == pytest.approx(0.95 / 6)
    assert policy.best("a", 4) == 0 and policy.best("b", 4) == 4 and policy.budget(["a", "b"], 4) == 4
    with pytest.raises(ValueError, match="accepted"):
        policy.observe("a", 2, 3)


def test_the_loop_decodes_the_target_alone_when_no_draft_pays():
    target = TableModel(8, 0)
    policy = AdaptiveDraftLength(LINEAR, 4, prior_alpha=0.5)
    result = generate(target, [0, 1], drafter=ModelDrafter(TableModel(8, 1)), gamma=4, max_new_tokens=20,
                      sampling=SamplingParams(1.0), generator=torch.Generator().manual_seed(0), draft_length=policy)
    assert result.stats.draft_calls == 0 and result.stats.draft_lengths == {0: 19}


def test_prompt_lookup_drafts_where_its_long_matches_pay():
    """A repeating context: 3-token matches are always right, and the lookup drafts them on llama.cpp's costs."""
    prompt = [2, 3, 4, 5, 6, 7] * 4
    target = TableModel(8, 0)
    target.table[:] = -10.0
    for a, b in zip(prompt, prompt[1:] + prompt[:1]):  # the target continues the cycle
        target.table[prompt[prompt.index(a) - 1], a, b] = 10.0
    policy = AdaptiveDraftLength(LLAMA_CPP, 4)
    result = generate(target, prompt, drafter=PromptLookupDrafter(), gamma=4, max_new_tokens=40,
                      sampling=SamplingParams(0.0), draft_length=policy)
    assert result.stats.accepted_tokens > 20 and result.stats.alpha == 1.0
    assert max(result.stats.draft_lengths) >= 2


def test_draft_length_must_cover_gamma():
    with pytest.raises(ValueError, match="fewer than gamma"):
        generate(TableModel(4, 0), [0, 1], drafter=PromptLookupDrafter(), gamma=5,
                 draft_length=AdaptiveDraftLength(FLAT, 3))


def test_lookup_then_model_drafts_no_model_token_where_only_the_lookup_pays():
    """Costs where the model draft (c = 0.5) never pays and the lookup's optimistic prior does: the model is
    never asked for a token, however long the lookup's budget."""
    from specdecode.drafters import LookupThenModelDrafter

    class CountingDrafter(ModelDrafter):
        asked = 0

        def propose(self, generated, gamma, sampling, generator):
            CountingDrafter.asked += 1
            return super().propose(generated, gamma, sampling, generator)

    model = CountingDrafter(TableModel(8, 1))
    drafter = LookupThenModelDrafter(model, min_match=2, max_match=3)
    policy = AdaptiveDraftLength(FLAT, 4, {model.name: 5.0})
    result = generate(TableModel(8, 0), [0, 1, 2, 3, 0, 1], drafter=drafter, gamma=4, max_new_tokens=30,
                      sampling=SamplingParams(0.0), draft_length=policy)
    assert CountingDrafter.asked == 0 and drafter.lookup_drafts > 0
    assert result.token_ids == generate(TableModel(8, 0), [0, 1, 2, 3, 0, 1], max_new_tokens=30,
                                        sampling=SamplingParams(0.0)).token_ids


def test_a_source_that_stopped_paying_is_tried_again_later():
    policy = AdaptiveDraftLength(LLAMA_CPP, 4, prior_alpha=0.9, prior_weight=1.0)
    for _ in range(3):
        policy.observe("ngram@3", 1, 0)
    assert policy.best("ngram@3", 4) == 0
    calls = 0
    while policy.best("ngram@3", 4) == 0:
        policy.called(1)
        calls += 1
    assert 20 < calls < 100  # the rejections fade: a copy that starts to pay is not missed for good
    assert AdaptiveDraftLength(LLAMA_CPP, 4, prior_alpha=0.9, decay=1.0).acceptance("x") == [0.9] * 4
    with pytest.raises(ValueError, match="decay"):
        AdaptiveDraftLength(LLAMA_CPP, 4, decay=0.0)


def test_unverified_draft_tokens_are_learned_like_verified_ones():
    policy = AdaptiveDraftLength(LLAMA_CPP, 4, prior_alpha=0.5, prior_weight=2.0, decay=1.0)
    for _ in range(8):
        policy.observe_unverified("ngram@3", 0, True)
        policy.observe_unverified("ngram@3", 1, True)
    assert policy.acceptance("ngram@3")[:3] == [pytest.approx(9 / 10), pytest.approx(9 / 10), 0.5]
    assert policy.best("ngram@3", 4) >= 1
    with pytest.raises(ValueError, match="position"):
        policy.observe_unverified("ngram@3", 4, True)


def test_the_loop_learns_a_lookup_it_does_not_verify_and_then_drafts_it():
    """A pessimistic prior: no lookup draft is worth verifying on llama.cpp's costs before it is known to be right.
    The target alone runs, the loop follows each lookup against the target's tokens, learns that the cycle
    repeats, and drafts it; the output is the target's own greedy output."""
    prompt = [2, 3, 4, 5, 6, 7] * 2
    target = TableModel(8, 0)
    target.table[:] = -10.0
    for a, b in zip(prompt, prompt[1:] + prompt[:1]):  # the target continues the cycle
        target.table[prompt[prompt.index(a) - 1], a, b] = 10.0
    policy = AdaptiveDraftLength(LLAMA_CPP, 4, prior_alpha=0.3, prior_weight=2.0)
    assert policy.budget(PromptLookupDrafter().sources, 4) == 0
    result = generate(target, prompt, drafter=PromptLookupDrafter(), gamma=4, max_new_tokens=40,
                      sampling=SamplingParams(0.0), draft_length=policy)
    assert result.stats.draft_lengths[0] >= 2 and max(result.stats.draft_lengths) >= 2, result.stats.draft_lengths
    assert result.stats.alpha == 1.0
    assert result.token_ids == generate(target, prompt, max_new_tokens=40, sampling=SamplingParams(0.0)).token_ids


def test_the_prior_is_optimistic_where_verification_is_cheap_and_pessimistic_where_it_costs():
    assert AdaptiveDraftLength(FLAT, 4).acceptance("x") == [0.9] * 4
    assert AdaptiveDraftLength(LLAMA_CPP, 4).acceptance("x") == [0.5] * 4
    measured = CostProfile(LLAMA_CPP.target_seconds, switch_seconds=0.05)  # with llama.cpp's change of shape
    steep, flat = AdaptiveDraftLength(measured, 4), AdaptiveDraftLength(FLAT, 4)
    steep.called(1)
    flat.called(1)
    assert steep.best("x", 4) == 0  # after the target alone: not worth verifying before it is known to be right
    assert flat.best("x", 4) == 4
