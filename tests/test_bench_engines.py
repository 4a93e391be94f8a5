"""`bench.engines`: its summary and headline table from recorded runs, and the greedy check's verdicts."""

from __future__ import annotations

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


class _Gaps:
    def __init__(self, gap: float) -> None:
        self.gap = gap

    def logit_gap(self, engine, ids, prefix) -> float:
        return self.gap


@pytest.mark.parametrize("gap, status", [(0.01, "near tie"), (3.0, "MISMATCH")])
def test_a_greedy_divergence_is_a_near_tie_only_where_the_top_two_logits_are_close(gap, status):
    runs = {"ours llamacpp target alone": Run([1, 2, 3], 1.0), "ours llamacpp --draft auto": Run([1, 2, 4], 1.0)}
    check = _greedy_check(_Gaps(gap), list(runs), torch.tensor([0]), runs)["ours llamacpp --draft auto"]
    assert check == {"status": status, "position": 2, "logit_gap": gap}
    assert gap < engines.NEAR_TIE or status == "MISMATCH"


def test_every_method_names_a_known_engine():
    assert {engine for engine, _ in METHODS.values()} == {"llamacpp", "native", "hf"}
