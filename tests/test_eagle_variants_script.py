"""scripts/eagle_variants.py on a tiny target's EAGLE work directory: the layers it reads, its networks, its runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_hf import tiny_llama

from specdecode.distill.eagle import init_eagle, target_features
from specdecode.distill.teacher import load_teacher
from specdecode.native.loading import native_from_hf_model
from script_loading import load_script
from test_distill import eagle_distilled, tiny_target  # noqa: F401  (fixtures)


@pytest.fixture()
def work(eagle_distilled, tmp_path):  # noqa: F811
    """A copy of the EAGLE work directory: the script writes its layers' outputs into it."""
    return shutil.copytree(eagle_distilled[0], tmp_path / "work")


def test_hidden_states_are_the_targets_residual_stream(work, tmp_path):
    script = load_script("eagle_variants")
    data = load_teacher(work)
    target = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    last = target.config.num_layers - 1
    hidden = script.hidden_states(target, data, [0, last], tmp_path / "h.safetensors")
    features = target_features(target, data, work)
    for h, f, ids in zip(hidden, features, data.ids):
        assert h.shape == (len(ids), 2 * target.config.hidden_size)
        # the last layer's output through the final norm is the cached feature (kept for positions 0 .. L - 2)
        final = target.norm(h[:-1, target.config.hidden_size :].float())
        assert torch.allclose(final, f.float(), atol=2e-2, rtol=1e-2)
    again = script.hidden_states(target, data, [0, last], tmp_path / "h.safetensors")  # read back
    assert all(torch.equal(a, b) for a, b in zip(hidden, again))


def test_the_fusion_starts_as_the_plain_network(work):
    script = load_script("eagle_variants")
    data = load_teacher(work)
    target = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    hidden = script.hidden_states(target, data, [0], work / "h.safetensors")
    features = target_features(target, data, work)
    output_ids = torch.load(work / "init.pt", weights_only=True)["output_ids"]
    network = init_eagle(target, output_ids, 0)
    embedding = target.embed.weight.detach()
    fusion = script.Fusion(1, target.config.hidden_size, target.config.rms_norm_eps)
    indices = list(range(3))
    ids = data.padded_ids(indices)
    fused = script.FusedObjective(network, fusion, hidden, embedding, features)
    plain = script.FusedObjective(network, None, None, embedding, features)
    assert torch.equal(fused.logits(indices, ids), plain.logits(indices, ids))
    with torch.no_grad():
        fusion.project.weight.normal_()
    assert not torch.allclose(fused.logits(indices, ids), plain.logits(indices, ids))


def test_one_decoder_layer_unrolls_as_the_eagle_network_does(work):
    script = load_script("eagle_variants")
    target = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    output_ids = torch.load(work / "init.pt", weights_only=True)["output_ids"]
    network = init_eagle(target, output_ids, 0)
    torch.manual_seed(0)
    previous, embedded = torch.randn(2, 7, target.config.hidden_size), torch.randn(2, 7, target.config.hidden_size)
    with torch.no_grad():
        ours = script.unrolled_features(network, [], previous, embedded, 3)
        theirs = network.unrolled_features(previous, embedded, 3)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, theirs))
        second = script.DecoderLayer(network.config, torch.float32)
        deeper = script.unrolled_features(network, [second], previous, embedded, 3)
    assert len(deeper) == 3 and not torch.allclose(deeper[0], ours[0])
    # still causal: position 3's output does not depend on what comes after it
    changed = embedded.clone()
    changed[:, 4:] += 1
    with torch.no_grad():
        again = script.unrolled_features(network, [second], previous, changed, 3)
    assert all(torch.allclose(a[:, :4], b[:, :4], atol=1e-5) for a, b in zip(deeper[:1], again[:1]))


@pytest.mark.parametrize("options", [["--layers", "0"], [], ["--decoder-layers", "2"], ["--tv-weight", "5"], ["--feature-weight", "0.5"],
                                     ["--depth", "2", "--deep-epochs", "1"]])
def test_each_variant_reports_held_out_alpha_each_epoch(work, tmp_path, options):
    script = load_script("eagle_variants")
    rows = script.main([str(work), *options, "--out", str(tmp_path / "run"), "--epochs", "2", "--threads", "1"])
    assert [r["epoch"] for r in rows] == [1, 2] and rows[0]["layers"] == ([0] if "--layers" in options else [])
    assert rows[0]["decoder_layers"] == (2 if "--decoder-layers" in options else 1)
    assert rows[0]["tv_weight"] == (5.0 if "--tv-weight" in options else 0.0)
    assert rows[0]["depth"] == (2 if "--depth" in options else 1)
    assert rows[0]["feature_weight"] == (0.5 if "--feature-weight" in options else 1.0)
    for row in rows:
        for depth in ("depth1", "depth2"):
            assert 0 <= row[depth]["alpha_greedy"] <= 1 and 0 < row[depth]["alpha_t1"] <= 1
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert logged == rows
    assert (work / "hidden-0.safetensors").is_file() == ("--layers" in options)


@pytest.mark.parametrize(("options", "name"), [(["--layers", "x"], "--layers"), (["--layers", "0,99"], "--layers"),
                                               (["--layers", "-1"], "--layers"), (["--decoder-layers", "0"], "--decoder-layers"),
                                               (["--tv-weight", "-1"], "--tv-weight"), (["--tv-weight", "inf"], "--tv-weight"),
                                               (["--feature-weight", "-1"], "--feature-weight"),
                                               (["--feature-weight", "nan"], "--feature-weight"), (["--deep-epochs", "1"], "deep_epochs")])
def test_bad_options_are_refused_by_name(work, tmp_path, options, name, capsys):
    with pytest.raises(SystemExit):
        load_script("eagle_variants").main([str(work), *options, "--out", str(tmp_path / "o")])
    assert name in capsys.readouterr().err


def test_deep_epochs_train_the_second_token_in_the_last_epoch_only(work, tmp_path, monkeypatch):
    from specdecode.distill.eagle import EagleObjective

    depths: list[int] = []  # the training objective's depth at each step
    loss = EagleObjective.loss
    monkeypatch.setattr(EagleObjective, "loss", lambda self, *batch: depths.append(self.depth) or loss(self, *batch))
    load_script("eagle_variants").main([str(work), "--depth", "2", "--deep-epochs", "1", "--out", str(tmp_path / "run"),
                                        "--epochs", "2", "--threads", "1"])
    steps = len(depths) // 2
    assert depths == [1] * steps + [2] * steps and steps > 0
