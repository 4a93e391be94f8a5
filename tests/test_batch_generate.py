"""Batched generation on the native engine (`native.batch_generate`): ragged prompts decode as each would alone."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare
from tiny_hf import tiny_llama, tiny_qwen2

from specdecode.native.batch_generate import generate_batch
from specdecode.native.batched import attention_inputs, decoder_stack
from specdecode.native.fast import pack_linears, packing_available
from specdecode.native.loading import native_from_hf_model


def _teacher_forced(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The final-norm outputs [L, H] and next-token log-probabilities [L, V] of ids, in one teacher-forced pass."""
    with torch.no_grad():
        h = model.norm(decoder_stack(model.layers, model.config, model.embed(torch.tensor([ids]))))[0]
        return h, torch.log_softmax(model.lm_head(h).float(), dim=-1)


def _greedy_alone(model, prompt: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    tokens: list[int] = []
    while len(tokens) < max_new_tokens and not (tokens and tokens[-1] in eos):
        tokens.append(int(_teacher_forced(model, prompt + tokens)[1][-1].argmax()))
    return tokens


@pytest.mark.parametrize("shared", [0, 6])
@pytest.mark.parametrize("packing", ["none", "packed"])
@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_greedy_rows_decode_as_each_prompt_alone_with_its_distributions_and_features(make, packing, shared):
    """Ragged prompts, which may start with the same `shared` tokens (one of them has a single token of its own)."""
    if packing == "packed" and not packing_available(torch.float32):
        pytest.skip("oneDNN packing is not available here")
    model = native_from_hf_model(make(seed=3, suppress_eos=False), torch.float32)
    plain = native_from_hf_model(make(seed=3, suppress_eos=False), torch.float32)
    if packing == "packed":
        pack_linears(model, "packed")
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, model.config.vocab_size, (shared,), generator=g).tolist()
    prompts = [prefix + torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in (5, 1, 12, 3, 8)]
    first = generate_batch(model, prompts, 10, eos=set(), top_k=4)
    eos = {first.tokens[0][3], first.tokens[2][5]}  # ends rows 0 and 2 early, and any other row that makes one
    made = generate_batch(model, prompts, 10, eos=eos, top_k=4, features=True)
    assert len(made.tokens[0]) <= 4 and len(made.tokens[2]) <= 6 and max(len(t) for t in made.tokens) == 10
    # so two of the five rows finished while others ran on: they left the batch (a quarter had finished)
    for prompt, tokens, ids, logp, features in zip(prompts, made.tokens, made.topk_ids, made.topk_logp, made.features):
        assert tokens == _greedy_alone(plain, prompt, 10, eos)
        h, exact = _teacher_forced(plain, prompt + tokens)
        at = exact[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]  # [n, V]: the distributions the tokens came from
        assert ids.shape == (len(tokens), 4) and ids[:, 0].tolist() == tokens
        torch.testing.assert_close(logp, at.gather(1, ids), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logp[:, 0], at.max(dim=-1).values, atol=1e-4, rtol=1e-4)  # the top-k are the largest
        assert features.dtype == torch.float16 and features.shape == (len(prompt) + len(tokens) - 1, h.shape[1])
        torch.testing.assert_close(features.float(), h[:-1], atol=2e-3, rtol=2e-3)


def test_the_tokens_every_prompt_starts_with_run_once(monkeypatch):
    """A shared prefix runs through each layer as one row; the rest of the prompts after it. A prompt that is
    all prefix but its last token keeps that token in the batch's pass."""
    import specdecode.native.batch_generate as batch_generate

    model = native_from_hf_model(tiny_llama(seed=3), torch.float32)
    shapes = []  # [rows, positions] of each layer's input

    def recorded(layer, config, x, *rope):
        shapes.append(tuple(x.shape[:2]))
        return attention_inputs(layer, config, x, *rope)

    monkeypatch.setattr(batch_generate, "attention_inputs", recorded)
    generate_batch(model, [[7, 8, 9, 10, 11], [7, 8, 9, 12], [7, 8, 9]], 2, eos=set(), top_k=2)
    layers = len(model.layers)
    assert shapes[: 2 * layers] == [(1, 2), (3, 3)] * layers  # [7, 8] once; then width 5 - 2 for the three rows
    shapes.clear()
    generate_batch(model, [[7, 8, 9], [5, 8, 9]], 2, eos=set(), top_k=2)
    assert shapes[:layers] == [(2, 3)] * layers  # nothing shared: one pass over all


def test_sampled_rows_follow_the_models_distribution_over_two_tokens():
    """Chi-square of the first two sampled tokens of two ragged prompts against p(a) p(b | a), enumerated."""
    model = native_from_hf_model(tiny_llama(seed=4, suppress_eos=False), torch.float32)
    prompts = [[5, 9, 11], [7, 3, 20, 21, 8, 30, 4]]
    samples = 3000
    made = generate_batch(model, prompts * samples, 2, eos=set(), top_k=3, generator=torch.Generator().manual_seed(0))
    for which, prompt in enumerate(prompts):
        counts = Counter(tuple(t) for t in made.tokens[which::2])
        first = _teacher_forced(model, prompt)[1][-1].exp()  # [V]
        exact = {}
        for a in range(model.config.vocab_size):
            second = _teacher_forced(model, prompt + [a])[1][-1].exp()
            exact.update({(a, b): float(first[a] * second[b]) for b in range(model.config.vocab_size)})
        assert _chi_square_pvalue(counts, exact, samples, min_cells=100) > 1e-3  # about 60% of the mass in cells of their own


def test_rows_that_outlive_finished_ones_still_follow_the_models_distribution():
    """Most likely first tokens end a row: over a quarter of the rows finish at once and leave the batch; the
    sequences of one or two tokens of the rest match p(a), or p(a) p(b | a), enumerated."""
    model = native_from_hf_model(tiny_llama(seed=5, suppress_eos=False), torch.float32)
    prompt, samples = [4, 17, 9, 2], 4000
    first = _teacher_forced(model, prompt)[1][-1].exp()  # [V]
    eos, mass = set(), 0.0
    for a in first.argsort(descending=True).tolist():  # the likeliest first tokens, up to a third of the mass
        if mass >= 1 / 3:
            break
        eos.add(a)
        mass += float(first[a])
    made = generate_batch(model, [prompt] * samples, 2, eos=eos, top_k=3, generator=torch.Generator().manual_seed(1))
    counts = Counter(tuple(t) for t in made.tokens)
    assert sum(counts[(a,)] for a in eos) > samples / 4  # enough rows finished together to leave the batch
    exact = {(a,): float(first[a]) for a in eos}
    for a in set(range(model.config.vocab_size)) - eos:
        second = _teacher_forced(model, prompt + [a])[1][-1].exp()
        exact.update({(a, b): float(first[a] * second[b]) for b in range(model.config.vocab_size)})
    assert _chi_square_pvalue(counts, exact, samples, min_cells=50) > 1e-3


def _chi_square_pvalue(counts: Counter, exact: dict[tuple[int, ...], float], samples: int, min_cells: int) -> float:
    """Chi-square p-value of observed sequence counts against exact probabilities; cells expected fewer than 5
    times are pooled into one, and at least min_cells must be left on their own."""
    observed, expected, rest_observed, rest_expected = [], [], 0, 0.0
    for cell, p in exact.items():
        if p * samples >= 5:
            observed.append(counts[cell])
            expected.append(p * samples)
        else:
            rest_observed += counts[cell]
            rest_expected += p * samples
    assert sum(observed) + rest_observed == samples  # no sequence outside the enumerated cells
    observed.append(rest_observed)
    expected.append(rest_expected)
    assert len(observed) > min_cells
    scale = sum(observed) / sum(expected)  # the float sum of p is 1 within rounding
    return chisquare(observed, [e * scale for e in expected]).pvalue


def test_bad_arguments_are_refused_by_name():
    model = native_from_hf_model(tiny_llama(seed=0, max_positions=16), torch.float32)
    with pytest.raises(ValueError, match="prompts must be non-empty"):
        generate_batch(model, [[3], []], 4, eos={1}, top_k=2)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        generate_batch(model, [[3]], 0, eos={1}, top_k=2)
    with pytest.raises(ValueError, match="exceed the model's 16 positions"):
        generate_batch(model, [[3] * 10], 7, eos={1}, top_k=2)
