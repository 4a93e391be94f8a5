"""scripts/draft_experiments.py on a tiny distill work directory: it runs, and its baselines match the distill report."""

from __future__ import annotations

import argparse
import json

import pytest
from script_loading import load_script
from test_distill import _data, tiny_target  # noqa: F401  (a fixture)

from specdecode.distill import DraftArchitecture, TrainConfig, distill


@pytest.fixture(scope="module")
def experiments():
    return load_script("draft_experiments")


@pytest.fixture(scope="module")
def cut_workdir(tiny_target, tmp_path_factory):  # noqa: F811
    target, prompts = tiny_target
    out = tmp_path_factory.mktemp("cut")
    train = TrainConfig(epochs=2, batch_tokens=256, lr=1e-2, warmup_steps=2)
    report = distill(str(target), out, _data(prompts), DraftArchitecture(output_vocab=40, target_layers=(1,)), train)
    return out, report


def _lines(capsys) -> dict[str, dict]:
    """The script's printed 'label {json}' lines, by label (its first word)."""
    out = {}
    for line in capsys.readouterr().out.splitlines():
        if "{" in line:
            out[line.split()[0]] = json.loads(line[line.index("{"):])
    return out


def _run(experiments, workdir, experiment, **overrides):
    args = dict(experiment=experiment, dir=str(workdir), epochs=1, lr=1e-3, loss="kl", threads=1, seed=0)
    experiments.run_variant(argparse.Namespace(**{**args, **overrides}))


def test_the_experiments_run_and_start_from_the_distilled_draft(experiments, cut_workdir, capsys):
    workdir, report = cut_workdir
    experiments.extract_features(workdir, threads=1)
    out = capsys.readouterr().out
    checked = out.rsplit("at ", 1)[1].split()[0]  # "agree/checked"
    agree, total = map(int, checked.split("/"))
    assert total > 0 and agree == total  # the features are what the target's head read for the cached data
    expected = report["held_out"]["all"]
    for experiment, loss in (("continue", "kl"), ("continue", "kl+tv"), ("cut+features", "kl")):
        _run(experiments, workdir, experiment, loss=loss)
        lines = _lines(capsys)
        # the same split and measure as the report; the added feature projection starts at zero
        assert lines["start"]["alpha_greedy"] == pytest.approx(expected["alpha_greedy"], abs=1e-9)
        assert lines["start"]["alpha_t1"] == pytest.approx(expected["alpha_t1"], rel=1e-4)
        assert 0 <= lines["epoch"]["alpha_t1"] <= 1
    _run(experiments, workdir, "eagle", epochs=2, lr=1e-2)
    lines = _lines(capsys)
    assert lines["epoch"]["alpha_t1"] > lines["start"]["alpha_t1"]  # it learns
    assert 0 <= lines["second-position"]["alpha_t1"] <= 1
