"""`bench.engines`: its summary and headline table from recorded runs, and the greedy check's verdicts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdecode.bench import engines
from specdecode.bench.engines import METHODS, Run, _greedy_check, headline_table, summarize


def _results() -> dict:
    def run(tokens, seconds, **extra):
        return {"tokens": tokens, "seconds": seconds, "rate": tokens / seconds, **extra}

    prompts = []
    for number, (peer, alone, auto) in enumerate([(1.0, 1.25, 1.0), (1.0, 1.0, 0.8)]):
        runs = {"llama.cpp": run(100, peer), "ours llamacpp target alone": run(100, alone),
                "ours llamacpp --draft auto": run(100, auto, draft_lengths={"0": 90, "2": 5})}
        prompts.append({"question_id": number, "category": "c", "prompt_tokens": 10,
                        "runs": {"0.0": {**runs, "greedy": {"ours llamacpp --draft auto": {"status": "identical"}}}}})
    return {"methods": ["llama.cpp", "ours llamacpp target alone", "ours llamacpp --draft auto"],
            "temperatures": [0.0], "prompts": prompts}


def test_summary_gives_absolute_rates_and_median_speedups_per_engine():
    summary = summarize(_results())["0.0"]
    assert summary["llama.cpp"]["tokens_per_s"] == pytest.approx(100.0)
    assert summary["ours llamacpp target alone"]["tokens_per_s"] == pytest.approx(200 / 2.25)
    auto = summary["ours llamacpp --draft auto"]
    assert auto["vs_ours_alone"] == pytest.approx((1.25 + 1.25) / 2) and auto["vs_ours_alone_min"] == pytest.approx(1.25)
    assert auto["vs_engine_peer"] == pytest.approx((1.0 + 1.25) / 2)
    assert auto["draft_lengths"] == {"0": 180, "2": 10} and auto["greedy"]["identical"] == 2


def test_headline_table_is_made_from_the_results():
    results = _results()
    results["summary"] = summarize(results)
    table = headline_table(results).splitlines()
    assert table[0].startswith("| method | engine | T=0.0 tok/s")
    assert table[4] == "| ours llamacpp --draft auto | llamacpp | 111.1 | 1.25x (min 1.25) | 1.11x | 2 identical |"


class _KernelModel:
    """A target whose one-token logits favour token 5 and whose batched logits favour `batched_favours`."""

    vocab_size = 8

    def __init__(self, batched_favours: int) -> None:
        self.batched_favours = batched_favours

    def prefill(self, ids):
        return torch.zeros(8)

    def extend(self, ids):
        rows = torch.zeros(len(ids), 8)
        rows[:, 5] = 1.0
        if len(ids) > 1:
            rows[-1, self.batched_favours] = 1.2
        return rows


def _methods(model) -> engines._Methods:
    methods = object.__new__(engines._Methods)
    methods.pipelines = {("llamacpp", False): SimpleNamespace(target=SimpleNamespace(model=model))}
    return methods


@pytest.mark.parametrize("batched_favours, status", [(7, "near tie"), (5, "MISMATCH")])
def test_a_greedy_divergence_is_a_near_tie_only_where_the_batched_kernel_orders_the_top_two_otherwise(
        batched_favours, status):
    """Plain decoding's [1, 2, 5] against a speculative [1, 2, 7]: explained where the batched logits prefer 7."""
    runs = {"ours llamacpp target alone": Run([1, 2, 5], 1.0), "ours llamacpp --draft auto": Run([1, 2, 7], 1.0)}
    check = _greedy_check(_methods(_KernelModel(batched_favours)), list(runs), torch.tensor([0]), runs)
    check = check["ours llamacpp --draft auto"]
    assert check["status"] == status and check["position"] == 2 and check["logit_gap"] == pytest.approx(1.0)
    assert check["kernel_difference"] == pytest.approx(1.2 if batched_favours == 7 else 0.2)


def test_a_divergence_at_the_first_token_is_a_mismatch():
    runs = {"ours llamacpp target alone": Run([5], 1.0), "ours llamacpp --draft auto": Run([7], 1.0)}
    check = _greedy_check(_methods(_KernelModel(7)), list(runs), torch.tensor([0]), runs)
    assert check["ours llamacpp --draft auto"] == {"status": "MISMATCH", "position": 0}


def test_every_method_names_a_known_engine():
    assert {engine for engine, _ in METHODS.values()} == {"llamacpp", "native", "hf"}


def test_a_peer_that_failed_on_a_prompt_is_left_out_and_counted():
    results = _results()
    results["prompts"][1]["runs"]["0.0"]["llama.cpp"] = {"error": "ValueError: could not broadcast"}
    summary = summarize(results)["0.0"]
    assert summary["llama.cpp"]["prompts"] == 1 and summary["llama.cpp"]["errors"] == 1
    assert summary["ours llamacpp --draft auto"]["vs_engine_peer"] == pytest.approx(1.0)  # prompt 0 only
    results["summary"] = summarize(results)
    results["machine"], results["target"], results["max_new_tokens"] = {"cpu": "cpu", "cpus": 2}, "t", 100
    assert "llama.cpp failed on question 1 at T=0.0 (left out): ValueError" in engines.render(results)
