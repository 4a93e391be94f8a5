"""scripts/eagle_fused_features.py on a tiny target's EAGLE work directory: the layers it reads, its start, its runs."""

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
    script = load_script("eagle_fused_features")
    data = load_teacher(work)
    target = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    last = target.config.num_layers - 1
    hidden = script.hidden_states(target, data, [0, last], tmp_path / "h.safetensors")
    features = target_features(target, data, work)
    for h, f, ids in zip(hidden, features, data.ids):
        assert h.shape == (len(ids), 2 * target.config.hidden_size)
        # the last layer's output through the final norm is the cached feature
        final = target.norm(h[:, target.config.hidden_size :].float())
        assert torch.allclose(final, f.float(), atol=2e-2, rtol=1e-2)
    again = script.hidden_states(target, data, [0, last], tmp_path / "h.safetensors")  # read back
    assert all(torch.equal(a, b) for a, b in zip(hidden, again))


def test_the_fusion_starts_as_the_plain_network(work):
    script = load_script("eagle_fused_features")
    data = load_teacher(work)
    target = native_from_hf_model(tiny_llama(suppress_eos=False), torch.float32)
    hidden = script.hidden_states(target, data, [0], work / "h.safetensors")
    features = target_features(target, data, work)
    output_ids = torch.load(work / "init.pt", weights_only=True)["output_ids"]
    network = init_eagle(target, output_ids, 0)
    embedding = target.embed.weight.detach()
    fusion = script.Fusion(1, target.config.hidden_size, target.config.rms_norm_eps)
    indices = list(range(3))
    ids = torch.nn.utils.rnn.pad_sequence([data.ids[i] for i in indices], batch_first=True)
    fused = script.FusedObjective(network, fusion, hidden, embedding, features)
    plain = script.FusedObjective(network, None, None, embedding, features)
    assert torch.equal(fused.logits(indices, ids), plain.logits(indices, ids))
    with torch.no_grad():
        fusion.project.weight.normal_()
    assert not torch.allclose(fused.logits(indices, ids), plain.logits(indices, ids))


def test_fused_and_plain_runs_report_held_out_alpha_each_epoch(work, tmp_path):
    script = load_script("eagle_fused_features")
    for layers, name in (("0", "fused"), ("", "plain")):
        rows = script.main([str(work), "--layers", layers, "--out", str(tmp_path / name), "--epochs", "2", "--threads", "1"])
        assert [r["epoch"] for r in rows] == [1, 2] and rows[0]["layers"] == ([0] if layers else [])
        for row in rows:
            for depth in ("depth1", "depth2"):
                assert 0 <= row[depth]["alpha_greedy"] <= 1 and 0 < row[depth]["alpha_t1"] <= 1
        logged = [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
        assert logged == rows
    assert (work / "hidden-0.safetensors").is_file()


@pytest.mark.parametrize("layers", ["x", "0,99", "-1"])
def test_bad_layers_are_refused_by_name(work, tmp_path, layers, capsys):
    with pytest.raises(SystemExit):
        load_script("eagle_fused_features").main([str(work), "--layers", layers, "--out", str(tmp_path / "o")])
    assert "--layers" in capsys.readouterr().err
