"""Continuous batching on the native engine: slots, batched passes, per-sequence drafters and exactness."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare
from test_exactness import P_VALUE_FLOOR, PROMPT, TINY_NATIVE, _eagle_case, _random_native, native_sequence_distribution

from specdecode.core.batch_costs import PassCosts, SharedPassDraftLength, share_profile
from specdecode.core.draft_length import AdaptiveDraftLength, CostProfile, best_draft_length
from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from specdecode.drafters.per_sequence import drafter_for_sequence
from specdecode.native.batching import BatchedNativeLM, NoFreeSlotError
from specdecode.native.config import NativeConfig
from specdecode.native.engine import NativeLM
from specdecode.native.model import NativeTransformer
from specdecode.native.slots import SlotCache, SlotRows, forward_rows

GQA = NativeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8, max_position_embeddings=256, attention_bias=True)


def _model(config: NativeConfig = GQA, dtype=torch.float64, seed: int = 0) -> NativeTransformer:
    torch.manual_seed(seed)
    model = NativeTransformer(config, dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def _reference(model: NativeTransformer) -> NativeLM:
    return NativeLM(model, max_cache_len=model.config.max_position_embeddings, packing="none")


class _Sequence:
    """A sequence fed by hand into a slot, with the single-sequence engine's logits for the same feeds."""

    def __init__(self, model, cache: SlotCache, slot: int, prompt: list[int]) -> None:
        self.slot, self.length = slot, len(prompt)
        self.reference = _reference(model)
        expected = self.reference.prefill(torch.tensor(prompt))
        got = model(torch.tensor(prompt), torch.arange(len(prompt)), cache.slot(slot), last_only=True,
                    end=len(prompt))[0].float()
        cache.wrote(slot, len(prompt))
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)

    def rows(self, tokens: list[int]) -> SlotRows:
        return SlotRows(self.slot, torch.tensor(tokens), self.length)

    def check(self, tokens: list[int], logits: torch.Tensor, keep: int | None = None) -> None:
        torch.testing.assert_close(logits, self.reference.extend(torch.tensor(tokens)), rtol=0, atol=1e-6)
        keep = len(tokens) if keep is None else keep  # the rest rolled back
        self.reference.rollback(self.reference.num_generated - len(tokens) + keep)
        self.length += keep


def test_passes_match_the_single_sequence_engine_as_sequences_join_leave_and_roll_back() -> None:
    model = _model()
    cache = SlotCache(model, num_slots=4, max_len=128)
    a = _Sequence(model, cache, 2, [1, 2, 3, 4, 5, 6, 7])
    b = _Sequence(model, cache, 0, [9, 8])
    feeds = [(a, [3], None), (b, [4, 5, 6], 1)]  # b keeps one of three: the rest is rolled back
    for (seq, tokens, keep), logits in zip(feeds, forward_rows(model, cache, [s.rows(t) for s, t, _ in feeds])):
        seq.check(tokens, logits, keep)
    c = _Sequence(model, cache, 1, list(range(10, 30)))  # joins, in the slot between the others
    feeds = [(a, [1, 2], None), (b, [7], None), (c, [11, 12, 13, 14], 2)]
    for (seq, tokens, keep), logits in zip(feeds, forward_rows(model, cache, [s.rows(t) for s, t, _ in feeds])):
        seq.check(tokens, logits, keep)
    d = _Sequence(model, cache, 0, [40, 41, 42])  # b left: d takes its slot, over b's stale keys and values
    feeds = [(c, [5], None), (d, [43, 44], None), (a, [6, 7, 8], None)]
    for (seq, tokens, keep), logits in zip(feeds, forward_rows(model, cache, [s.rows(t) for s, t, _ in feeds])):
        seq.check(tokens, logits, keep)
    # a prompt joins a pass (more rows than are padded: attention of its own; only its last row's logits), and a
    # sequence feeds a long run of rows beside it
    prompt = list(range(30, 50))
    e = _reference(model)
    long = list(range(1, 13))
    logits = forward_rows(model, cache, [SlotRows(3, torch.tensor(prompt), 0, last_only=True), c.rows([6]),
                                         a.rows(long)])
    assert logits[0].shape == (1, GQA.vocab_size)
    torch.testing.assert_close(logits[0][0], e.prefill(torch.tensor(prompt)), rtol=0, atol=1e-6)
    c.check([6], logits[1])
    a.check(long, logits[2])


def test_never_written_cache_memory_cannot_leak_into_a_pass() -> None:
    """A padded pass reads (masked) positions a slot never wrote: they are zeroed first, so even NaN there is harmless."""
    model = _model()
    cache = SlotCache(model, num_slots=3, max_len=64)
    cache.storage.fill_(float("nan"))
    a, b = _Sequence(model, cache, 0, [1, 2]), _Sequence(model, cache, 2, list(range(3, 30)))
    feeds = [(a, [5, 6]), (b, [7])]
    for (seq, tokens), logits in zip(feeds, forward_rows(model, cache, [s.rows(t) for s, t in feeds])):
        seq.check(tokens, logits)


def _on_threads(count: int, run, timeout: float) -> None:
    """run(i) for i in range(count), each on a thread of its own (a sequence of a batch each); their errors fail
    the test."""
    errors: list = []

    def guarded(i: int) -> None:
        try:
            run(i)
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not errors, errors


def _decode_in_threads(batch: BatchedNativeLM, jobs: list[dict]) -> list:
    """Each job {prompt, kwargs} decoded on its own thread, as one sequence of the batch."""
    results: list = [None] * len(jobs)

    def run(i: int) -> None:
        with batch.open() as sequence:
            job = jobs[i]
            drafter = job.get("drafter")
            results[i] = generate(sequence, job["prompt"], drafter=drafter(sequence) if drafter else None,
                                  **job["kwargs"])

    _on_threads(len(jobs), run, 60)
    return results


def test_sequences_decoded_together_are_token_identical_to_each_decoded_alone() -> None:
    model = _model()
    reference = _reference(model)
    prompts = [[1, 2, 3, 1, 2, 3], [5, 6, 7, 8, 9], [10, 11], [3, 3, 3, 3, 4, 5, 6, 7], [20, 21, 22]]
    lengths = [40, 33, 25, 18, 30]
    greedy = SamplingParams(0.0)
    expected = [generate(reference, p, drafter=PromptLookupDrafter(), gamma=3, max_new_tokens=n, sampling=greedy).token_ids
                for p, n in zip(prompts, lengths)]
    batch = BatchedNativeLM(model, max_batch=3, max_length=128)  # 5 sequences, 3 slots: two wait for a free one
    jobs = [{"prompt": p, "drafter": lambda s: PromptLookupDrafter(),
             "kwargs": dict(gamma=3, max_new_tokens=n, sampling=greedy)} for p, n in zip(prompts, lengths)]
    opened: list = []
    original_open = batch.open

    def open_when_free():
        while True:
            try:
                sequence = original_open()
                opened.append(sequence.slot)
                return sequence
            except NoFreeSlotError:
                threading.Event().wait(0.001)

    batch.open = open_when_free
    results = _decode_in_threads(batch, jobs)
    assert [r.token_ids for r in results] == expected
    assert max(batch.passes.sequences) == 3 and set(opened) == {0, 1, 2}
    assert batch.open_sequences == 0


def test_open_refuses_beyond_max_batch_and_close_frees_the_slot() -> None:
    batch = BatchedNativeLM(_model(), max_batch=2, max_length=32)
    first, second = batch.open(), batch.open()
    with pytest.raises(NoFreeSlotError):
        batch.open()
    second.close()
    assert batch.open().slot == second.slot
    with pytest.raises(RuntimeError, match="closed"):
        second.prefill(torch.tensor([1]))
    with pytest.raises(ValueError, match="max_batch"):
        BatchedNativeLM(_model(), max_batch=0, max_length=32)
    first.close()


def test_drafters_per_sequence() -> None:
    target, eagle = _eagle_case([0, 2, 3, 5, 7])
    batch = BatchedNativeLM(target.model, max_batch=2, max_length=64)
    with batch.open() as sequence:
        own = drafter_for_sequence(LookupThenModelDrafter(eagle, min_match=2, max_match=3), sequence)
        assert own.model.network is eagle.network and own.model.target is sequence
        assert own.model._cache is not eagle._cache
        assert (own.lookup.min_ngram, own.lookup.max_ngram) == (2, 3)
        lookup = PromptLookupDrafter(max_ngram=4)
        assert drafter_for_sequence(lookup, sequence) is not lookup
        with pytest.raises(ValueError, match="draft: .* per sequence"):
            drafter_for_sequence(ModelDrafter(target), sequence)


# several requests in one batch, each its own sampling parameters and generator: every one is distributed as
# its target's samples (EAGLE drafts on each sequence's own features, cost-aware lengths priced per pass)
REQUESTS = [SamplingParams(0.8), SamplingParams(1.0, top_k=5), SamplingParams(1.2, top_p=0.9)]


def test_batched_requests_each_keep_their_target_distribution() -> None:
    target, eagle = _eagle_case([0, 2, 3, 5, 7])
    batch = BatchedNativeLM(target.model, max_batch=len(REQUESTS), max_length=64)
    costs = PassCosts({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.5, 16: 3.0})
    samples, length = 3000, 3
    counts = [Counter() for _ in REQUESTS]
    drafted = [0] * len(REQUESTS)

    def run(i: int) -> None:
        generator = torch.Generator().manual_seed(10 + i)
        for _ in range(samples):
            with batch.open() as sequence:
                draft_length = SharedPassDraftLength(
                    CostProfile({1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15}), 3, {eagle.name: 0.05}, costs=costs,
                    batch_state=lambda: batch.batch_state(sequence), single_t1=1.0)
                result = generate(sequence, PROMPT, drafter=eagle.on_target(sequence), gamma=3,
                                  max_new_tokens=length, sampling=REQUESTS[i], generator=generator,
                                  draft_length=draft_length)
                counts[i][tuple(result.token_ids)] += 1
                drafted[i] += result.stats.draft_tokens

    _on_threads(len(REQUESTS), run, 300)
    assert max(batch.passes.sequences) > 1  # the requests did share passes
    assert all(n > samples // 4 for n in drafted), drafted  # and verified EAGLE drafts in them
    for sampling, observed in zip(REQUESTS, counts):
        exact = native_sequence_distribution(target, PROMPT, length, sampling)
        assert set(observed) <= set(exact)
        cells = [s for s in exact if exact[s] * samples >= 5]
        rest = [s for s in exact if exact[s] * samples < 5]
        obs = [observed[s] for s in cells] + ([sum(observed[s] for s in rest)] if rest else [])
        exp = [exact[s] * samples for s in cells] + ([sum(exact[s] for s in rest) * samples] if rest else [])
        scale = samples / sum(exp)
        pvalue = chisquare(obs, [e * scale for e in exp]).pvalue
        assert pvalue > P_VALUE_FLOOR, f"{sampling}: chi-square p-value {pvalue:.2e}"


def test_pass_costs_interpolate_and_the_share_profile_prices_draft_tokens_by_batch_size() -> None:
    costs = PassCosts({1: 10.0, 2: 10.5, 4: 11.0, 32: 40.0})
    assert costs.at(3) == pytest.approx(10.75) and costs.at(64) == pytest.approx(40.0 + 32 * 29 / 28)
    alone = share_profile(costs, 1, 0, 4)
    assert alone.target_seconds == {1: 10.0, 2: 10.5, 3: 10.75, 4: 11.0}
    acceptance = [0.7] * 3
    assert best_draft_length(acceptance, 0.0, alone, 3) == 3  # one sequence: rows are nearly free
    crowded = share_profile(costs, 16, 15, 4)  # sixteen sequences: a row costs about a sequence's share
    assert crowded.target_seconds[1] == pytest.approx(costs.at(16) / 16)
    assert best_draft_length(acceptance, 0.0, crowded, 3) == 0
    assert best_draft_length([0.99] * 3, 0.0, crowded, 3) > 0  # a draft that is nearly always right still pays
    with pytest.raises(ValueError, match="P\\(1\\)"):
        PassCosts({2: 1.0})


def test_shared_pass_draft_length_follows_the_batch() -> None:
    costs = PassCosts({1: 10.0, 2: 10.2, 4: 10.4, 8: 12.0, 16: 20.0, 64: 80.0})
    state = [(1, 0)]
    profile = CostProfile({1: 10.0, 2: 10.2, 3: 10.3, 4: 10.4})
    length = SharedPassDraftLength(profile, 3, {"model": 0.1}, prior_alpha=0.8, costs=costs,
                                   batch_state=lambda: state[0], single_t1=10.0)
    assert length.budget(["model"], 3) == 3
    assert length.draft_costs["model"] == pytest.approx(0.1)
    state[0] = (32, 31)
    assert length.budget(["model"], 3) == 0
    assert length.draft_costs["model"] == pytest.approx(0.1 * 10.0 / (costs.at(32) / 32))
    assert isinstance(length, AdaptiveDraftLength)


def test_a_prompt_start_some_slot_holds_is_copied_not_computed() -> None:
    """The second and third prompts share a 20-token start with the first (a chat template's system prompt): they
    reuse its keys and values, from another slot or from their own slot's earlier sequence, with the same logits."""
    model = _model()
    reference = _reference(model)
    batch = BatchedNativeLM(model, max_batch=2, max_length=64)
    system = list(range(1, 21))
    first, second, third = system + [30, 31], system + [40, 41, 42], system[:15] + [50]
    a = batch.open()
    torch.testing.assert_close(a.prefill(torch.tensor(first)), reference.prefill(torch.tensor(first)))
    assert batch.reused_prompt_tokens == 0
    b = batch.open()  # another slot; a leaves before b runs (open sequences advance together, each on its thread)
    a.close()
    torch.testing.assert_close(b.prefill(torch.tensor(second)), reference.prefill(torch.tensor(second)))
    assert batch.reused_prompt_tokens == 20  # copied from a's slot
    torch.testing.assert_close(b.extend(torch.tensor([7, 8])), reference.extend(torch.tensor([7, 8])))
    b.close()
    with batch.open() as c:  # a's slot again: 15 of its own positions kept
        assert c.slot == a.slot
        torch.testing.assert_close(c.prefill(torch.tensor(third)), reference.prefill(torch.tensor(third)))
        assert batch.reused_prompt_tokens == 35
