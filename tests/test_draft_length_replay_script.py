"""scripts/draft_length_replay.py on a tiny target and its EAGLE draft: the replay's target calls are greedy decoding's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters import LookupThenModelDrafter
from specdecode.drafters.eagle import EagleDrafter, load_eagle
from specdecode.distill.teacher import chat_ids, load_teacher
from specdecode.native import load_native
from script_loading import load_script
from test_distill import _prompt_file, eagle_distilled, tiny_target  # noqa: F401  (fixtures)


def _script():
    return load_script("draft_length_replay")


def spec_bench_style_prompts(tmp_path: Path) -> tuple[list[dict], Path]:
    """Eight word prompts ({'category', 'prompt'} rows) and the same as a Spec-Bench-style JSONL file."""
    rows = [json.loads(line) for line in _prompt_file(tmp_path / "words.jsonl", count=8, seed=7).read_text().splitlines()]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": r["category"], "turns": [r["prompt"]]}) for r in rows))
    return rows, prompts


def test_replay_makes_the_target_calls_greedy_decoding_makes(eagle_distilled, tiny_target, tmp_path, capsys):  # noqa: F811
    target, _ = tiny_target
    draft = eagle_distilled[0] / "draft"
    rows, prompts = spec_bench_style_prompts(tmp_path)
    out = tmp_path / "out"
    script = _script()
    results = script.main(["--target", str(target), "--draft", str(draft), "--prompts", str(prompts), "--out", str(out),
                           "--max-new-tokens", "16", "--settings", "1:0,3:0,3:0.5", "--cost-reps", "1"])
    assert list(results) == ["γ=1 min-confidence 0", "γ=3 min-confidence 0", "γ=3 min-confidence 0.5"]
    assert all(r["all"]["answers"] == len(rows) and r["all"]["speedup"] > 0 for r in results.values())
    assert "mean of the category medians" in capsys.readouterr().out and (out / "replay.md").is_file()

    # the replay's calls, answer by answer, against decoding with the same drafter (prompt lookup, then the draft)
    data = load_teacher(out)
    native, tokenizer = (loaded := load_native(str(target))).model, loaded.tokenizer
    network, output_ids, _ = load_eagle(draft)
    features = script.answers_and_features(str(target), prompts, out, 16)[2]  # read back from out
    predictions = script.draft_predictions(network, output_ids, native.model.embed.weight.detach(), data, features, 3)
    by_prompt = {tuple(ids[: first + 1].tolist()): i for i, (ids, first) in enumerate(zip(data.ids, data.first))}
    lookups = 0
    for gamma, threshold in [(1, 0.0), (3, 0.0), (3, 0.5)]:
        for row in rows:
            prompt = chat_ids(tokenizer, row["prompt"])
            i = by_prompt[tuple(prompt)]
            calls = script.replay(data.ids[i], data.first[i], *predictions[i], gamma, threshold, 16)
            drafter = LookupThenModelDrafter(EagleDrafter(network, output_ids, native, min_confidence=threshold))
            stats = generate(native, torch.tensor(prompt), drafter=drafter, gamma=gamma, max_new_tokens=16,
                             sampling=SamplingParams(0.0), eos_token_ids={tokenizer.eos_token_id}).stats
            assert 1 + len(calls) == stats.target_calls, f"gamma {gamma}, min_confidence {threshold}: {row['prompt']!r}"
            assert sum(c.new_tokens for c in calls) + 1 == stats.new_tokens
            assert sum(c.model_tokens == 0 and c.drafted > 0 for c in calls) == drafter.lookup_drafts
            if threshold == 0:  # every draft gamma long (capped by max_new_tokens), also past an answer's EOS
                assert sum(c.drafted for c in calls) == stats.draft_tokens
            lookups += drafter.lookup_drafts
    assert lookups > 0  # both kinds of draft were replayed


@pytest.mark.parametrize("text", ["2", "2:x", "0:0.5", "2:1.5"])
def test_settings_must_be_gamma_and_min_confidence_pairs(text, capsys):
    with pytest.raises(SystemExit):
        _script().main(["--settings", text])
    assert "settings" in capsys.readouterr().err


@pytest.mark.parametrize("gamma", [3, 4])
def test_a_draft_runs_past_the_answers_end_as_decoding_drafts_it(gamma):
    """The answer ends (an EOS) inside the last call's draft: decoding still drafts gamma tokens there, and the replay
    counts them (the target verifies them all), accepting only up to the answer's end."""
    ids = torch.tensor([10, 11, 20, 21, 22])  # the prompt ids[:2], then the answer 20 21 22 (22 its EOS)
    depth = 4
    tokens = torch.full((depth, len(ids)), 7)  # the draft's argmax at depth k + 1, position j (for position j + 1)
    tokens[:, :-1] = ids[1:]  # right wherever the answer goes on
    calls = _script().replay(ids, 1, tokens, torch.ones(depth, len(ids)), gamma, 0.0, 16)
    assert [(c.drafted, c.model_tokens, c.new_tokens) for c in calls] == [(gamma, gamma, 2)]
