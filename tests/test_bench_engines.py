"""`bench.engines`: its summary and headline table from recorded runs, and the greedy check's verdicts."""

from __future__ import annotations

import pytest
import torch

from specdecode.bench import engines
from specdecode.bench.engines import METHODS, Run, _greedy_check, headline_table, parse_method, summarize


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


def _runs(spec_last: torch.Tensor) -> dict[str, Run]:
    """Plain decoding's [1, 2, 5] and a speculative [1, 2, 7], with the logits each chose its third token from."""
    plain_last = torch.zeros(8)
    plain_last[5], plain_last[7] = 1.0, 0.9
    same = {0: torch.zeros(8), 1: torch.zeros(8)}
    return {"ours llamacpp target alone": Run([1, 2, 5], 1.0, logits={**same, 2: plain_last}),
            "ours llamacpp --draft auto": Run([1, 2, 7], 1.0, logits={**same, 2: spec_last})}


@pytest.mark.parametrize("shift, status", [(0.3, "near tie"), (3.0, "MISMATCH")])
def test_a_greedy_divergence_is_a_near_tie_only_within_the_engines_kernel_noise(shift, status):
    spec_last = torch.zeros(8)
    spec_last[5], spec_last[7] = 1.0, 1.0 + shift  # the speculative run's logits preferred 7
    methods = [engines.parse_method(name) for name in _runs(spec_last)]
    check = _greedy_check(methods, _runs(spec_last), {"llamacpp": 0.5})["ours llamacpp --draft auto"]
    assert check["status"] == status and check["position"] == 2
    assert check["logit_gap"] == pytest.approx(0.1) and check["logit_difference"] == pytest.approx(0.1 + shift)


def test_kernel_noise_compares_one_batched_call_with_single_tokens():
    class Rounding:
        vocab_size, max_length = 8, 1000

        def prefill(self, ids):
            return torch.zeros(8)

        def extend(self, ids):
            return torch.full((len(ids), 8), 0.25 if len(ids) > 1 else 0.0)

    assert engines.kernel_noise(Rounding()) == pytest.approx(0.25)


def test_every_default_method_names_a_known_engine():
    assert {engines.parse_method(name).engine for name in METHODS} == {"llamacpp", "native", "hf"}


def test_method_names_are_parsed_into_pipeline_options():
    m = engines.parse_method("ours native --dtype bfloat16 --draft qwen+ngram --draft-backend llamacpp --gamma 4")
    assert (m.engine, m.kind, m.dtype, m.draft, m.draft_backend, m.gamma) == (
        "native", "ours", "bfloat16", "qwen+ngram", "llamacpp", 4)
    assert m.group == "native bfloat16"
    alone = engines.parse_method("ours native --dtype bfloat16 target alone")
    assert alone.draft is None and alone.group == m.group
    assert engines.parse_method("llama.cpp speculative qwen").draft == "qwen"
    for bad in ("ours gpu target alone", "ours native --draft x target alone", "ours native --dtype fp8 target alone",
                "llama.cpp speculative "):
        with pytest.raises(ValueError, match="methods"):
            engines.parse_method(bad)


def test_a_peer_that_failed_on_a_prompt_is_left_out_and_counted():
    results = _results()
    results["prompts"][1]["runs"]["0.0"]["llama.cpp"] = {"error": "ValueError: could not broadcast"}
    summary = summarize(results)["0.0"]
    assert summary["llama.cpp"]["prompts"] == 1 and summary["llama.cpp"]["errors"] == 1
    assert summary["ours llamacpp --draft auto"]["vs_engine_peer"] == pytest.approx(1.0)  # prompt 0 only
    results["summary"] = summarize(results)
    results["machine"], results["target"], results["max_new_tokens"] = {"cpu": "cpu", "cpus": 2}, "t", 100
    assert "llama.cpp failed on question 1 at T=0.0 (left out): ValueError" in engines.render(results)


def test_the_committed_report_and_readme_tables_come_from_the_committed_results():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    headline = root / "docs/benchmarks/amd-epyc-avx512-engines/headline"
    table = headline_table(json.loads((headline / "results.json").read_text()))
    assert table in (headline / "report.md").read_text()
    assert table in (root / "README.md").read_text()


def test_the_speculation_summary_predicts_the_speedup_by_thm_3_8_from_measured_counts():
    def stats(new, calls, seconds, draft_tokens=0, draft_seconds=0.0, proposed=(), accepted=()):
        return {"new_tokens": new, "target_calls": calls, "seconds": seconds, "first_token_seconds": 0.1,
                "draft_tokens": draft_tokens, "draft_seconds": draft_seconds, "proposed_per_position": list(proposed),
                "accepted_per_position": list(accepted)}

    # 5 calls of 2 draft tokens, each first token accepted: 10 tokens after the first, 2 per call
    spec = {"draft_lengths": {"2": 5}, "stats": stats(11, 6, 0.95, 10, 0.1, (5, 5), (5, 0))}
    plain = {"stats": stats(11, 11, 1.1)}
    costs = {"t1_seconds": 0.1, "ratios": {"1": 1.0, "2": 1.2, "3": 1.5}}
    out = engines._speculation([spec], [plain], costs)
    assert out["tokens_per_call"] == 2.0 and out["alpha_per_position"] == [1.0, 0.0]
    assert out["c"] == pytest.approx(0.1)  # 0.1 s over 10 draft tokens, over T(1) = 0.1 s
    assert out["predicted_speedup"] == pytest.approx(10 / (5 * 1.5 + 10 * 0.1))
    assert out["measured_speedup"] == pytest.approx((10 / 0.85) / (10 / 1.0))


def test_every_method_is_warmed_up_untimed_with_a_few_tokens_before_the_timed_runs():
    class Runner:
        max_new_tokens = 128

        def __init__(self):
            self.calls = []

        def run(self, m, ids, temperature, seed):
            self.calls.append((m.name, self.max_new_tokens, temperature))

    runner, methods = Runner(), [parse_method("llama.cpp"), parse_method("ours native --draft auto")]
    engines.warm_up(runner, methods, torch.tensor([1, 2, 3]))
    assert runner.calls == [("llama.cpp", engines.WARM_UP_TOKENS, 0.0), ("ours native --draft auto", engines.WARM_UP_TOKENS, 0.0)]
    assert runner.max_new_tokens == 128
