"""scripts/tree_estimate.py on a tiny target and its EAGLE draft: a chain-shaped tree replays as the chain draft."""

from __future__ import annotations

import pytest

from specdecode.distill.teacher import load_teacher
from specdecode.drafters.eagle import load_eagle
from specdecode.native import load_native
from script_loading import load_script
from test_distill import eagle_distilled, tiny_target  # noqa: F401  (fixtures)
from test_draft_length_replay_script import spec_bench_style_prompts


def test_a_chain_shaped_tree_accepts_what_the_chain_draft_does(eagle_distilled, tiny_target, tmp_path, capsys):  # noqa: F811
    target, _ = tiny_target
    draft = eagle_distilled[0] / "draft"
    _, prompts = spec_bench_style_prompts(tmp_path)
    out = tmp_path / "out"
    script = load_script("tree_estimate")
    result = script.main(["--target", str(target), "--draft", str(draft), "--prompts", str(prompts), "--out", str(out),
                          "--max-new-tokens", "16", "--nodes", "1,3,6", "--lookup-gamma", "3", "--depth", "3",
                          "--top", "2", "--cost-reps", "1", "--slope", "0.1"])
    assert list(result["results"]) == ["1 nodes", "3 nodes", "6 nodes"] and result["verify"][3] == pytest.approx(1.2)
    assert all(len(set(tree)) == len(tree) <= n for n, tree in result["trees"].items())  # at most n seen paths
    for tree in result["trees"].values():  # prefix-closed: every node's parent is in the tree
        assert all(path[:-1] in tree for path in tree if len(path) > 1)
    assert "| 6 |" in capsys.readouterr().out

    # the tree (0), (0, 0), (0, 0, 0) against the replay of the chain draft of 3 tokens, answer by answer
    replay = load_script("draft_length_replay")
    data = load_teacher(out)
    embedding = load_native(str(target)).model.model.embed.weight.detach()
    network, output_ids, _ = load_eagle(draft)
    features = replay.answers_and_features(str(target), prompts, out, 16)[2]  # read back from out
    predictions = replay.draft_predictions(network, output_ids, embedding, data, features, 3)
    ranks = script.draft_ranks(network, output_ids, embedding, data, features, 3, 2)
    chain = {(0,), (0, 0), (0, 0, 0)}
    accepted = 0
    for i in range(len(data)):
        expected = replay.replay(data.ids[i], data.first[i], *predictions[i], 3, 0.0, 16)
        calls = script.tree_calls(data.ids[i], data.first[i], ranks[i], chain, 3, 2, 16)
        assert [c.new_tokens for c in calls] == [c.new_tokens for c in expected], f"answer {i}"
        accepted += sum(c.new_tokens - 1 for c in calls if c.model_tokens)
    assert accepted > 0  # the draft's tokens were accepted somewhere


@pytest.mark.parametrize(("args", "name"), [(["--nodes", "0"], "nodes"), (["--nodes", "2,x"], "nodes"),
                                            (["--depth", "0"], "depth"), (["--top", "0"], "top"),
                                            (["--lookup-gamma", "-1"], "lookup-gamma")])
def test_bad_options_are_refused_by_name(args, name, capsys):
    with pytest.raises(SystemExit):
        load_script("tree_estimate").main(args)
    assert name in capsys.readouterr().err


def test_the_tree_is_chosen_on_the_positions_decoding_drafts():
    """Position first + 1 (the first answer token) comes from the prefill: its rank path must not choose the tree."""
    import torch

    script = load_script("tree_estimate")
    # prompt ids[:2] (first = 1), answer ids[2:6]; ranks [depth 1, L 6]: the draft guessing token j + 1 from j
    ranks = torch.tensor([[9, 1, 0, 0, 0, 2]])  # token 2 (the first answer token) at rank 1; tokens 3-5 at rank 0
    assert script.best_tree([ranks], [1], 4, 2) == [(0,)]  # room for 4 nodes, but rank 1 was never drafted


def test_a_draft_that_never_ranks_the_answer_makes_an_empty_tree_that_replays():
    import torch

    script = load_script("tree_estimate")
    ranks = torch.full((2, 6), 2)  # top 2: no answer token is ever among the draft's two best
    tree = script.best_tree([ranks], [1], 4, 2)
    assert tree == []
    ids = torch.tensor([5, 6, 7, 8, 9, 10])  # nothing to copy from the prompt either
    calls = script.tree_calls(ids, 1, ranks, set(tree), 3, 2, 16)
    assert [c.new_tokens for c in calls] == [1, 1, 1] and all(c.model_tokens == 0 for c in calls)
