"""The `specdecode generate` command on tiny saved checkpoints (random weights, word-level tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_hf import (
    WORDS,
    perturbed_copy,
    save_tiny_checkpoint,
    save_tiny_eagle_draft,
    tiny_llama,
    tiny_t5,
    tiny_tokenizer,
)

from specdecode.cli import main
from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.models import wrap_hf_model
from specdecode.native.fast import packing_available
from specdecode.drafters.distilled import bundled_draft_dir
from specdecode.pipeline import Pipeline, draft_model_part, verification_rows

PROMPT = "the quick red fox runs to the river"  # 'fox' is not in the vocabulary: <unk>
MAX_NEW = 12


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(seed=20)
    return {"target": target, "near": perturbed_copy(target, seed=21, scale=0.05), "t5": tiny_t5(seed=22)}


@pytest.fixture(scope="module")
def dirs(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    tokenizer = tiny_tokenizer()
    return {
        "target": save_tiny_checkpoint(root / "target", models["target"], tokenizer),
        "draft": save_tiny_checkpoint(root / "draft", models["near"], tokenizer),
        "t5": save_tiny_checkpoint(root / "t5", models["t5"], tokenizer),
        "no_chat": save_tiny_checkpoint(root / "no_chat", models["target"], tiny_tokenizer(chat_template=None)),
        "eagle": save_tiny_eagle_draft(root / "eagle", models["target"], tokenizer),
    }


def _expected_ids(hf_model, text: str, max_new: int = MAX_NEW, chat: bool = True) -> list[int]:
    """The target's own greedy continuation of the prompt, as the CLI should encode it."""
    tokenizer = tiny_tokenizer()
    if chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    return generate(wrap_hf_model(hf_model), ids, max_new_tokens=max_new, sampling=SamplingParams(0.0)).token_ids


def _decode(ids: list[int]) -> str:
    return tiny_tokenizer().decode(ids, skip_special_tokens=True)


def _run_json(capsys, *argv) -> list[dict]:
    assert main(["generate", *map(str, argv), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return [json.loads(line) for line in lines]


# --------------------------------------------------------------------------- JSON output


def test_json_compare_of_a_single_token_has_no_speedup_after_the_first_token(capsys, dirs):
    (record,) = _run_json(capsys, PROMPT, "--target", dirs["target"], "--draft", "ngram", "--compare", "--max-new-tokens", 1)
    assert len(record["token_ids"]) == 1 and record["stats"]["decode_tokens_per_s"] == 0.0
    assert record["speedup"] > 0 and record["decode_speedup"] is None


@pytest.mark.parametrize("draft", ["model", "ngram", "none"])
def test_json_compare(capsys, models, dirs, draft):
    spec = str(dirs["draft"]) if draft == "model" else draft
    (record,) = _run_json(
        capsys, PROMPT, "--target", dirs["target"], "--draft", spec, "--compare", "--max-new-tokens", MAX_NEW
    )
    expected = _expected_ids(models["target"], PROMPT)
    assert len(expected) == MAX_NEW
    assert record["token_ids"] == expected
    assert record["text"] == _decode(expected)
    assert record["finish_reason"] == "length"
    assert record["baseline"]["token_ids"] == expected
    assert record["identical"] is True
    assert isinstance(record["speedup"], float) and record["speedup"] > 0
    assert record["decode_speedup"] == pytest.approx(record["stats"]["decode_tokens_per_s"] / record["baseline"]["decode_tokens_per_s"])
    assert record["baseline"]["tokens_per_s"] > 0 and record["baseline"]["seconds"] > 0

    stats = record["stats"]
    for key in ("target_calls", "draft_calls", "mean_accepted", "alpha", "tokens_per_s", "seconds"):
        assert key in stats
    assert stats["new_tokens"] == MAX_NEW
    assert stats["seconds"] > 0 and stats["tokens_per_s"] == pytest.approx(MAX_NEW / stats["seconds"])
    assert stats["mean_accepted"] == pytest.approx(MAX_NEW / stats["target_calls"])
    assert stats["new_tokens"] == stats["target_calls"] + stats["accepted_tokens"]
    if draft == "none":
        assert record["draft"] is None
        assert stats["gamma"] == 0 and stats["draft_calls"] == 0 and stats["alpha"] is None
        assert stats["target_calls"] == MAX_NEW
    else:
        assert record["draft"] == (f"model:{dirs['draft']}" if draft == "model" else "ngram:1-3")
        assert stats["gamma"] == 4
    if draft == "model":  # a near copy of the target: most drafts are accepted
        assert stats["draft_calls"] >= 1
        assert stats["accepted_tokens"] > 0
        assert stats["target_calls"] < MAX_NEW
        evaluated = stats["accepted_tokens"] + stats["rejections"]
        assert stats["alpha"] == pytest.approx(stats["accepted_tokens"] / evaluated)


@pytest.mark.parametrize("gamma", [1, 3])
def test_json_mixed_pair_t5_target_llama_draft(capsys, models, dirs, gamma):
    (record,) = _run_json(
        capsys, PROMPT, "--target", dirs["t5"], "--draft", dirs["target"], "--gamma", gamma,
        "--compare", "--max-new-tokens", MAX_NEW,
    )
    assert record["token_ids"] == _expected_ids(models["t5"], PROMPT)
    assert record["identical"] is True
    assert record["stats"]["gamma"] == gamma


@pytest.mark.parametrize("packing", ["none", "dual"])
def test_packing_keeps_the_greedy_tokens(capsys, models, dirs, packing):
    (record,) = _run_json(capsys, PROMPT, "--target", dirs["target"], "--draft", dirs["draft"], "--packing", packing,
                          "--max-new-tokens", MAX_NEW)
    assert record["token_ids"] == _expected_ids(models["target"], PROMPT)


@pytest.mark.parametrize(("draft", "gamma", "min_confidence", "rows"), [
    ("none", 3, 0.6, 1), (None, 3, 0.0, 4), (None, None, 0.0, 5), (None, 4, 0.6, 3), (None, 1, 0.6, 2),
    ("ngram", 1, 0.6, 2), ("auto", None, 0.6, 6), ("auto", 8, 0.6, 9), ("eagle", 5, 0.6, 3), ("eagle+ngram", 5, 0.6, 3),
    ("eagle", 1, 0.6, 2), ("eagle", 5, 0.0, 6),
])
def test_the_target_layout_is_chosen_for_gamma_plus_one_tokens_per_call_at_most_three_if_drafts_end_early(
    dirs, draft, gamma, min_confidence, rows
):
    # None: a model draft, gamma defaults to DEFAULT_GAMMA = 4; auto: prompt lookup here (no bundled draft),
    # gamma 5; a draft model (EAGLE or not) that ends early drafts short
    draft = str(dirs["draft"]) if draft is None else draft.replace("eagle", str(dirs["eagle"]))
    target = Pipeline.load(str(dirs["target"]), draft, gamma, min_confidence=min_confidence).target.model
    if rows == 1 or not packing_available(torch.float32):
        assert target.layout_choice is None  # one token: dual, the fastest single token, untimed
    else:
        assert target.layout_choice.rows == rows and target.packing == target.layout_choice.packing


def test_auto_on_the_default_target_verifies_three_tokens_per_call_as_its_eagle_draft_ends_early():
    assert verification_rows("auto", 5, 0.6) == 3 and verification_rows("bundled", 1, 0.6) == 2
    assert verification_rows("auto", 5, 0.0) == 6 and verification_rows("auto", 5, 0.6, engine="llamacpp") == 6  # ngram
    assert verification_rows("none", 5, 0.6) == 1


def test_draft_model_part_names_the_model_a_draft_runs(dirs):
    bundled = str(bundled_draft_dir("smollm2-135m-instruct"))
    assert draft_model_part("auto") == draft_model_part("bundled+ngram") == draft_model_part("bundled") == bundled
    assert draft_model_part("auto", engine="llamacpp") is None  # prompt lookup: the pair's entry is native only
    assert draft_model_part("ngram") is None and draft_model_part("none") is None
    assert draft_model_part("some/dir+ngram") == "some/dir"
    assert draft_model_part("auto", str(dirs["target"])) is None  # no bundled draft: prompt lookup
    with pytest.raises(ValueError, match="no bundled draft"):
        verification_rows("bundled", 4, 0.6, str(dirs["target"]))  # before the target is loaded


def test_pipeline_load_checks_gamma_before_loading(dirs):
    with pytest.raises(ValueError, match="gamma must be an integer >= 1"):
        Pipeline.load(str(dirs["target"]), "ngram", 0)


def test_packing_on_the_hf_backend_exits_2(capsys, dirs):
    assert main(["generate", PROMPT, "--target", str(dirs["target"]), "--backend", "hf", "--packing", "none"]) == 2
    assert "packing='none' needs the native engine" in capsys.readouterr().err


def test_json_without_compare_has_no_baseline(capsys, dirs):
    (record,) = _run_json(capsys, PROMPT, "--target", dirs["target"], "--draft", "none", "--max-new-tokens", 5)
    assert len(record["token_ids"]) == 5
    assert "baseline" not in record and "identical" not in record and "speedup" not in record


def test_max_new_tokens_zero(capsys, dirs):
    (record,) = _run_json(capsys, PROMPT, "--target", dirs["target"], "--draft", "ngram", "--max-new-tokens", 0)
    assert record["token_ids"] == [] and record["text"] == ""
    assert record["stats"]["target_calls"] == 0


def test_no_chat_encodes_the_raw_prompt(capsys, models, dirs):
    (record,) = _run_json(
        capsys, PROMPT, "--target", dirs["target"], "--draft", "none", "--no-chat", "--max-new-tokens", MAX_NEW
    )
    raw = _expected_ids(models["target"], PROMPT, chat=False)
    assert record["token_ids"] == raw
    assert raw != _expected_ids(models["target"], PROMPT, chat=True)  # so the check means something


def test_json_sampling_is_seeded(capsys, dirs):
    argv = [PROMPT, "--target", dirs["target"], "--draft", dirs["draft"], "--temperature", 1.5, "--top-k", 20,
            "--top-p", 0.95, "--compare", "--max-new-tokens", 16]
    (first,) = _run_json(capsys, *argv, "--seed", 3)
    (again,) = _run_json(capsys, *argv, "--seed", 3)
    (other,) = _run_json(capsys, *argv, "--seed", 4)
    assert first["identical"] is None  # only greedy outputs must match token for token
    assert len(first["token_ids"]) == 16
    assert first["token_ids"] == again["token_ids"]
    assert first["baseline"]["token_ids"] == again["baseline"]["token_ids"]
    assert other["token_ids"] != first["token_ids"]


# --------------------------------------------------------------------------- streaming text


@pytest.mark.parametrize("draft", ["model", "ngram", "none"])
def test_streaming_text_and_stats_line(capsys, models, dirs, draft):
    spec = str(dirs["draft"]) if draft == "model" else draft
    assert main(["generate", PROMPT, "--target", str(dirs["target"]), "--draft", spec, "--compare",
                 "--max-new-tokens", str(MAX_NEW)]) == 0
    out, err = capsys.readouterr()
    assert out == _decode(_expected_ids(models["target"], PROMPT)) + "\n"
    assert f"{MAX_NEW} tokens in" in err
    assert "target calls" in err
    assert "greedy outputs identical" in err
    assert "DIFFER" not in err
    assert "[target alone]" in err
    assert "first token after" in err and "x after the first token)" in err
    label = {"model": f"model:{spec}", "ngram": "ngram:1-3", "none": "none"}[draft]
    assert f"[{label} gamma=4]" in err


def test_streaming_without_compare(capsys, dirs):
    assert main(["generate", PROMPT, "--target", str(dirs["target"]), "--draft", "ngram", "--max-new-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().split()) <= 6  # <= because <unk>/<pad> decode to nothing
    assert "target calls" in err
    assert "identical" not in err and "[target alone]" not in err


# --------------------------------------------------------------------------- prompt files


def _write_questions(path, questions):
    path.write_text("\n".join(json.dumps(q) for q in questions) + "\n\n")  # a blank line is skipped
    return path


QUESTIONS = [
    {"question_id": 1, "category": "qa", "turns": ["the cat sees a bird", "and then ?"]},
    {"question_id": 7, "category": "math_reasoning", "turns": ["one two three four"]},
    {"question_id": 9, "turns": ["hello world"]},  # no category
]


def test_prompt_file_json(capsys, models, dirs, tmp_path):
    path = _write_questions(tmp_path / "questions.jsonl", QUESTIONS)
    records = _run_json(
        capsys, "--prompt-file", path, "--target", dirs["target"], "--draft", dirs["draft"],
        "--max-new-tokens", 8, "--compare",
    )
    assert len(records) == 3
    assert [r["question_id"] for r in records] == [1, 7, 9]
    assert [r.get("category") for r in records] == ["qa", "math_reasoning", None]
    assert "category" not in records[2]
    for record, question in zip(records, QUESTIONS):
        assert record["token_ids"] == _expected_ids(models["target"], question["turns"][0], max_new=8)
        assert record["identical"] is True


def test_prompt_file_limit(capsys, dirs, tmp_path):
    path = _write_questions(tmp_path / "questions.jsonl", QUESTIONS)
    records = _run_json(
        capsys, "--prompt-file", path, "--limit", 2, "--target", dirs["target"], "--draft", "none", "--max-new-tokens", 3
    )
    assert [r["question_id"] for r in records] == [1, 7]


def test_prompt_file_bad_line(capsys, dirs, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n" + json.dumps({"question_id": 2, "prompt": "x"}) + "\n")
    with pytest.raises(SystemExit) as info:
        main(["generate", "--prompt-file", str(path), "--target", str(dirs["target"])])
    assert info.value.code == 2
    assert "line 2" in capsys.readouterr().err


@pytest.mark.parametrize("line", ['{"turns": "the dog runs"}', '{"turns": [null]}', '{"turns": []}', '{"turns": ["  "]}', "[1]"])
def test_prompt_file_malformed_turns_are_refused_before_any_generation(capsys, dirs, tmp_path, line):
    """A string is not a list of turns (its first character is no prompt); the bad line is named up front."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n" + line + "\n")
    with pytest.raises(SystemExit) as info:
        main(["generate", "--prompt-file", str(path), "--target", str(dirs["target"]), "--max-new-tokens", "2"])
    assert info.value.code == 2
    out = capsys.readouterr()
    assert "line 2" in out.err and out.out == ""


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args,message",
    [
        (["--temperature=-0.5"], "temperature"),
        (["--temperature", "nan"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-k=-1"], "top_k"),
        (["--gamma", "0"], "gamma"),
        (["--gamma=-2"], "gamma"),
        (["--min-confidence", "1.5"], "min-confidence"),
        (["--min-confidence", "high"], "min-confidence"),
        (["--max-new-tokens=-1"], "max_new_tokens"),
        (["--packing", "fast"], "--packing"),
    ],
)
def test_bad_parameters_exit_2(capsys, dirs, args, message):
    with pytest.raises(SystemExit) as info:
        main(["generate", PROMPT, "--target", str(dirs["target"]), "--draft", "none", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "usage:" in err


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt_exits_2(capsys, dirs, prompt):
    with pytest.raises(SystemExit) as info:
        main(["generate", prompt, "--target", str(dirs["target"])])
    assert info.value.code == 2
    assert "prompt must be a non-empty string" in capsys.readouterr().err


def test_prompt_and_prompt_file_exit_2(capsys, dirs, tmp_path):
    path = _write_questions(tmp_path / "q.jsonl", QUESTIONS)
    for argv in (["generate", PROMPT, "--prompt-file", str(path)], ["generate"]):
        with pytest.raises(SystemExit) as info:
            main([*argv, "--target", str(dirs["target"])])
        assert info.value.code == 2
        assert "either a prompt or --prompt-file" in capsys.readouterr().err


def test_missing_prompt_file_exits_2(capsys, dirs, tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["generate", "--prompt-file", str(tmp_path / "nope.jsonl"), "--target", str(dirs["target"])])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "prompt-file" in err and "not found" in err


def test_prompt_file_without_questions_exits_2(capsys, dirs, tmp_path):
    """A file of blank lines is refused up front, as `bench --prompts` refuses it, not run as zero prompts."""
    path = tmp_path / "blank.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(SystemExit) as info:
        main(["generate", "--prompt-file", str(path), "--target", str(dirs["target"])])
    assert info.value.code == 2
    out = capsys.readouterr()
    assert "prompt-file" in out.err and "holds no questions" in out.err and out.out == ""


def test_bad_limit_exits_2(capsys, dirs, tmp_path):
    path = _write_questions(tmp_path / "q.jsonl", QUESTIONS)
    with pytest.raises(SystemExit) as info:
        main(["generate", "--prompt-file", str(path), "--limit", "0", "--target", str(dirs["target"])])
    assert info.value.code == 2
    assert "limit" in capsys.readouterr().err


def test_no_command_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


# --------------------------------------------------------------------------- chat template, stop strings, loading


def test_chat_without_template_exits_2(capsys, dirs):
    assert main(["generate", PROMPT, "--target", str(dirs["no_chat"]), "--draft", "none", "--chat"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "specdecode: error: chat:" in err
    assert "no chat template" in err


def test_no_template_defaults_to_raw_prompt(capsys, models, dirs):
    (record,) = _run_json(capsys, PROMPT, "--target", dirs["no_chat"], "--draft", "none", "--max-new-tokens", MAX_NEW)
    assert record["token_ids"] == _expected_ids(models["target"], PROMPT, chat=False)


def _stop_case(models) -> tuple[str, str, str]:
    """(full text, a stop string from its middle, the text cut before the stop string)."""
    full = _decode(_expected_ids(models["target"], PROMPT))
    words = full.split()
    assert len(words) >= 6
    stop = f"{words[3]} {words[4]}"  # two words: matched across a token boundary
    cut = full[: full.find(stop)]
    assert 0 < len(cut) < len(full) - len(stop)
    return full, stop, cut


def test_stop_string_json(capsys, models, dirs):
    full, stop, cut = _stop_case(models)
    (record,) = _run_json(
        capsys, PROMPT, "--target", dirs["target"], "--draft", dirs["draft"], "--stop", stop,
        "--max-new-tokens", MAX_NEW, "--compare",
    )
    assert stop not in record["text"]
    assert record["text"] == cut
    assert record["finish_reason"] == "stop"
    expected = _expected_ids(models["target"], PROMPT)
    assert record["token_ids"] == expected[: len(record["token_ids"])]
    assert len(record["token_ids"]) < MAX_NEW
    assert stop in _decode(record["token_ids"])  # the kept tokens end with the stop string; the text hides it
    assert record["identical"] is True  # the baseline stops at the same token


def test_stop_string_streaming(capsys, models, dirs):
    full, stop, cut = _stop_case(models)
    argv = ["generate", PROMPT, "--target", str(dirs["target"]), "--draft", "ngram", "--max-new-tokens", str(MAX_NEW)]
    assert main([*argv, "--stop", "never there", "--stop", stop]) == 0
    out, err = capsys.readouterr()
    assert out == cut + "\n"
    assert "finish: stop" in err


def test_missing_target_exits_2(capsys, tmp_path):
    missing = tmp_path / "missing"
    assert main(["generate", PROMPT, "--target", str(missing), "--draft", "none"]) == 2
    err = capsys.readouterr().err
    assert "specdecode: error:" in err and "not found" in err and str(missing) in err


def test_missing_gguf_target_exits_2(capsys, tmp_path):
    assert main(["generate", PROMPT, "--target", str(tmp_path / "model.gguf"), "--draft", "none"]) == 2
    assert "GGUF file not found" in capsys.readouterr().err


def test_incompatible_draft_exits_2(capsys, dirs, models, tmp_path):
    bad = save_tiny_checkpoint(tmp_path / "bad", models["near"], tiny_tokenizer(list(reversed(WORDS))))
    assert main(["generate", PROMPT, "--target", str(dirs["target"]), "--draft", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "specdecode: error: draft:" in err and "different ids" in err


def test_prompt_longer_than_the_context_exits_2(capsys, tmp_path):
    short = save_tiny_checkpoint(tmp_path / "short", tiny_llama(seed=23, max_positions=8), tiny_tokenizer())
    assert main(["generate", "one two three four five six seven eight nine", "--target", str(short),
                 "--draft", "none", "--no-chat"]) == 2
    assert "context window 8" in capsys.readouterr().err
