"""scripts/spec_bench_alpha.py on a tiny target and its EAGLE draft: per-category alpha, equal to decoding's at gamma = 1."""

from __future__ import annotations

import json

import pytest
import torch

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters.eagle import EagleDrafter, load_eagle
from specdecode.distill.teacher import chat_ids, load_teacher
from specdecode.native import load_native
from script_loading import load_script
from test_distill import _prompt_file, eagle_distilled, tiny_target  # noqa: F401  (fixtures)


def _script():
    return load_script("spec_bench_alpha")


def test_alpha_per_category_equals_greedy_decoding_at_gamma_one(eagle_distilled, tiny_target, tmp_path, capsys):  # noqa: F811
    target, _ = tiny_target
    draft = eagle_distilled[0] / "draft"
    prompts = tmp_path / "prompts.jsonl"
    rows = [json.loads(line) for line in _prompt_file(tmp_path / "words.jsonl", count=6, seed=5).read_text().splitlines()]
    questions = [(row["category"], row["prompt"]) for row in rows]
    prompts.write_text("\n".join(json.dumps({"category": c, "turns": [t]}) for c, t in questions))
    out = tmp_path / "out"
    argv = ["--target", str(target), "--draft", str(draft), "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "12"]
    results = _script().main(argv)[str(draft)]
    assert set(results) == {"a", "b", "all"} and results["all"]["alpha_greedy"] > 0
    assert results["a"]["positions"] + results["b"]["positions"] == results["all"]["positions"] > 0
    assert "| all |" in capsys.readouterr().out and (out / "alpha.md").is_file()

    loaded = load_native(str(target))
    native, tokenizer = loaded.model, loaded.tokenizer
    data = load_teacher(out)  # the answers scored are the target's greedy answers
    answers = {tuple(ids[: first + 1].tolist()): ids[first + 1 :].tolist() for ids, first in zip(data.ids, data.first)}
    for _, text in questions:
        prompt = chat_ids(tokenizer, text)
        alone = generate(native, torch.tensor(prompt), max_new_tokens=12, sampling=SamplingParams(temperature=0.0),
                         eos_token_ids={tokenizer.eos_token_id})
        assert answers[tuple(prompt)] == alone.token_ids

    # decoding at gamma = 1, T = 0 accepts about the same share of the draft's tokens (the same answers and features)
    network, output_ids, _ = load_eagle(draft)
    accepted = evaluated = 0
    for _, text in questions:
        drafter = EagleDrafter(network, output_ids, native)
        result = generate(native, torch.tensor(chat_ids(tokenizer, text)), drafter=drafter, gamma=1, max_new_tokens=12,
                          sampling=SamplingParams(temperature=0.0), eos_token_ids={tokenizer.eos_token_id})
        accepted += result.stats.accepted_tokens
        evaluated += result.stats.accepted_tokens + result.stats.rejections
    assert accepted / evaluated == pytest.approx(results["all"]["alpha_greedy"], abs=0.1)

    # --depth 2 scores the second draft token (what the network computes there: test_eagle's unrolled-features test)
    second = _script().main([*argv, "--depth", "2"])[str(draft)]["all"]
    assert "draft depth 2" in capsys.readouterr().out and (out / "alpha-depth2.md").is_file()
    assert second["positions"] == results["all"]["positions"] and second["alpha_t1"] != results["all"]["alpha_t1"]

    with pytest.raises(SystemExit, match="other settings"):
        _script().main([*argv[:-1], "8"])


def test_answers_made_at_another_batch_size_are_reused(tiny_target, tmp_path):  # noqa: F811
    """The replay scripts pass no batch size: they read answers spec_bench_alpha made with --batch-size 4."""
    target, _ = tiny_target
    prompts = tmp_path / "prompts.jsonl"
    rows = [json.loads(line) for line in _prompt_file(tmp_path / "words.jsonl", count=10, seed=3).read_text().splitlines()]
    prompts.write_text("\n".join(json.dumps({"category": row["category"], "turns": [row["prompt"]]}) for row in rows))
    out = tmp_path / "out"
    made, _, _ = _script().answers_and_features(str(target), prompts, out, 8, batch_size=4)
    again, _, _ = _script().answers_and_features(str(target), prompts, out, 8)
    assert [ids.tolist() for ids in again.ids] == [ids.tolist() for ids in made.ids] and len(made) == 10
    with pytest.raises(SystemExit, match="--batch-size 4"):
        _script().answers_and_features(str(target), prompts, out, 8, batch_size=5)
