"""The EAGLE drafter: the target's kept features, the network's cached steps, greedy equality, the draft directory.

The statistical exactness of EAGLE drafts is in test_exactness.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specdecode.core.sampling import SamplingParams
from specdecode.decoding import generate
from specdecode.drafters.base import Draft
from specdecode.drafters.distilled import load_distilled
from specdecode.drafters.eagle import EagleDrafter, is_eagle_draft, load_eagle, save_eagle
from specdecode.models.loading import LoadedModel
from specdecode.native.batched import decoder_stack
from specdecode.native.config import NativeConfig
from specdecode.native.eagle import EagleNetwork, read_at_depth
from specdecode.native.engine import NativeLM
from specdecode.native.model import NativeTransformer
from specdecode.pipeline import DEFAULT_MIN_CONFIDENCE, make_drafter

CONFIG = NativeConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1, head_dim=8, max_position_embeddings=128)
HEAD = [0, 3, 4, 7, 9, 12, 15, 20, 21, 30]


def _randomize(module: torch.nn.Module, seed: int, std: float = 0.5) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)


def _target(seed: int = 0) -> NativeLM:
    model = NativeTransformer(CONFIG)
    _randomize(model, seed)
    return NativeLM(model, max_cache_len=128, packing="none")


def _network(seed: int = 1) -> EagleNetwork:
    network = EagleNetwork(dataclasses.replace(CONFIG, num_layers=1), len(HEAD))
    _randomize(network, seed)
    with torch.no_grad():
        network.head_weight.normal_(0.0, 1.0)
    return network


def _full_features(model: NativeTransformer, ids: list[int]) -> torch.Tensor:
    """Final-norm outputs [n, H] of the whole sequence in one batched pass (no cache)."""
    x = model.embed(torch.tensor([ids]))
    return model.norm(decoder_stack(model.layers, model.config, x))[0]


def test_kept_features_match_a_full_forward_after_rollback():
    target = _target()
    target.keep_features()
    prompt = [1, 5, 2, 8]
    target.prefill(torch.tensor(prompt))
    target.extend(torch.tensor([6, 7, 11]))
    target.rollback(1)  # keep 6; 7 and 11 were a rejected draft
    target.extend(torch.tensor([13, 2]))
    sequence = prompt + [6, 13, 2]
    torch.testing.assert_close(target.features(0, len(sequence)), _full_features(target.model, sequence))
    torch.testing.assert_close(target.features(2, 5), _full_features(target.model, sequence)[2:5])


def test_features_are_refused_where_unknown():
    target = _target()
    target.prefill(torch.tensor([1, 2, 3]))
    with pytest.raises(RuntimeError, match="keep_features"):
        target.features(0, 2)
    target.keep_features()  # after the prompt ran: its positions' features were never written
    with pytest.raises(ValueError, match=r"\[3, 3\) are known"):
        target.features(0, 2)
    target.extend(torch.tensor([4, 5]))
    assert target.features(3, 5).shape == (2, CONFIG.hidden_size)
    with pytest.raises(ValueError, match=r"positions \[3, 6\)"):
        target.features(3, 6)


def test_network_steps_through_its_cache_as_over_the_whole_sequence():
    network = _network()
    torch.manual_seed(2)
    previous, embedded = torch.randn(1, 7, 16), torch.randn(1, 7, 16)
    whole = network.unrolled_features(previous, embedded, 1)[0][0]  # [7, H]
    cache = network.new_cache(32)
    with torch.inference_mode():
        pieces = [network.step(previous[0, a:b], embedded[0, a:b], a, cache) for a, b in ((0, 3), (3, 4), (4, 7))]
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=1e-4, atol=1e-5)


def test_unrolled_features_are_what_the_network_computes_steps_into_a_draft():
    """Depth d at position j: catch up on the target's features to j - d + 1, then d - 1 steps on its own g."""
    network = _network()
    torch.manual_seed(3)
    length = 9
    previous, embedded = torch.randn(1, length, 16), torch.randn(1, length, 16)  # previous: f shifted by one
    unrolled = network.unrolled_features(previous, embedded, 3)
    with torch.inference_mode():
        for depth in (1, 2, 3):
            for j in range(depth - 1, length):
                cache = network.new_cache(32)
                known = j - depth + 2  # positions 0 .. j - depth + 1 come from the target's features
                g = network.step(previous[0, :known], embedded[0, :known], 0, cache)[-1:]
                for position in range(known, j + 1):
                    g = network.step(g, embedded[0, position : position + 1], position, cache)
                torch.testing.assert_close(g[0], unrolled[depth - 1][0, j], rtol=1e-4, atol=1e-5)


def test_read_at_depth_adds_the_positions_deeper_tokens_read():
    wanted = torch.tensor([[False, False, True, False, True, False]])
    read = [read_at_depth(wanted, level, 3)[0].nonzero().flatten().tolist() for level in (1, 2, 3)]
    assert read == [[0, 1, 2, 3, 4], [1, 2, 3, 4], [2, 4]]
    assert torch.equal(read_at_depth(wanted, 1, 1), wanted)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_unrolled_features_at_wanted_positions_equal_the_whole_computation_with_gradients(depth):
    """Training runs the output projection and MLP only where g is read: the same g there, the same gradients."""
    torch.manual_seed(4)
    previous, embedded = torch.randn(2, 11, 16), torch.randn(2, 11, 16)
    wanted = torch.zeros(2, 11, dtype=torch.bool)
    wanted[0, 5:9], wanted[1, 2:11] = True, True  # a response after a prompt; a longer one
    weights = torch.randn(depth, 2, 11, 16)

    def run(where):
        network = _network()
        outputs = network.unrolled_features(previous, embedded, depth, where)
        loss = sum((g[wanted] * w[wanted]).sum() for g, w in zip(outputs, weights))
        return outputs, torch.autograd.grad(loss, list(network.parameters()))

    (whole, whole_grads), (part, part_grads) = run(None), run(wanted)
    for level, (g_whole, g_part) in enumerate(zip(whole, part), start=1):
        read = read_at_depth(wanted, level, depth)
        torch.testing.assert_close(g_part[read], g_whole[read], rtol=1e-5, atol=1e-5)
        assert not g_part[~read].any()  # not computed
    for a, b in zip(part_grads, whole_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"wanted must be \[B, L\]"):
        _network().unrolled_features(previous, embedded, depth, wanted[:, :5])


def test_unrolled_depth_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="depth must be a positive integer"):
        _network().unrolled_features(torch.zeros(1, 2, 16), torch.zeros(1, 2, 16), 0)


@pytest.mark.parametrize("min_confidence", [0.0, 0.3])
def test_greedy_with_an_eagle_draft_equals_the_target_alone(min_confidence):
    target = _target()
    prompt = [1, 5, 2, 8, 3]
    alone = generate(target, prompt, max_new_tokens=40, sampling=SamplingParams(0.0))
    drafter = EagleDrafter(_network(), torch.tensor(HEAD), target, min_confidence=min_confidence)
    for gamma in (1, 3, 5):
        result = generate(target, prompt, drafter=drafter, gamma=gamma, max_new_tokens=40, sampling=SamplingParams(0.0))
        assert result.token_ids == alone.token_ids, f"gamma={gamma}"
        assert result.stats.draft_calls > 0


def _proposal(min_confidence: float, sampling: SamplingParams, gamma: int = 6) -> tuple[Draft, list[torch.Tensor]]:
    """One draft of at most `gamma` tokens after the prompt [1, 2, 3] and one generated token (generator seeded),
    and the head's logits [K] at each drafted token."""
    target = _target()
    network = _network()
    head, logits = network.head, []
    network.head = lambda g: logits.append(head(g)[0]) or head(g)  # records what the drafter's q comes from
    drafter = EagleDrafter(network, torch.tensor(HEAD), target, min_confidence=min_confidence)
    target.prefill(torch.tensor([1, 2, 3]))
    drafter.start(torch.tensor([1, 2, 3]))
    return drafter.propose(torch.tensor([4]), gamma, sampling, torch.Generator().manual_seed(0)), logits


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_confidence_ends_the_draft_after_the_first_token_its_q_gave_less(temperature):
    """The draft is the full draft's prefix up to and including the first token whose q (at T=0 the softmax of
    the head's logits) is below min_confidence; the q of the tokens it keeps are unchanged."""
    sampling = SamplingParams(temperature)
    full, logits = _proposal(0.0, sampling)
    rows = [HEAD.index(token) for token in full.tokens.tolist()]
    confidences = [float(torch.softmax(x, dim=-1)[row]) for x, row in zip(logits, rows)]  # q at T=1 and at T=0
    assert len(full) == 6
    for threshold in sorted(confidences)[:4]:
        ends = next((i + 1 for i, c in enumerate(confidences) if c < threshold), 6)
        draft, _ = _proposal(threshold, sampling)
        assert draft.tokens.tolist() == full.tokens[:ends].tolist(), f"threshold {threshold}"
        if not sampling.greedy:
            torch.testing.assert_close(draft.probs, full.probs[:ends])
    assert len(_proposal(1.0, sampling)[0]) == 1  # no q of a random network reaches 1


@pytest.mark.parametrize("value", [-0.1, 1.5, True, "0.5"])
def test_min_confidence_must_be_a_probability(value):
    with pytest.raises(ValueError, match="min_confidence"):
        EagleDrafter(_network(), torch.tensor(HEAD), _target(), min_confidence=value)


def test_first_draft_token_reads_the_feature_of_the_last_position_the_target_ran():
    """With fc passing norm(f) through and a layer that adds nothing, the first draft token is head(norm(f_{n-2})):
    the drafter must read the target's feature at position n - 2 (sequence of n tokens, the last not yet fed)."""
    target = _target()
    network = _network()
    with torch.no_grad():  # g_j = fc(...) = the previous feature: the layer's residual branches off
        for p in network.layer.parameters():
            p.zero_()
        network.fc.weight.zero_()
        network.fc.weight[:, :16] = torch.eye(16)
        network.fc.bias.zero_()
        network.feature_norm.weight.copy_(target.model.norm.weight)
    drafter = EagleDrafter(network, torch.tensor(HEAD), target)
    drafter.start(torch.tensor([1, 2]))
    target.prefill(torch.tensor([1, 2]))
    target.extend(torch.tensor([3]))  # the loop's state: target ran over [1, 2, 3], 3 generated plus one more
    draft = drafter.propose(torch.tensor([3, 9]), 1, SamplingParams(0.0), None)
    features = target.features(2, 3)  # f at the last position the target ran (token 3)
    expected = HEAD[int(network.head(features[0] / features[0].pow(2).mean().add(CONFIG.rms_norm_eps).sqrt()
                                     * target.model.norm.weight).argmax())]
    assert draft.tokens.tolist() == [expected]


def test_eagle_draft_proposes_only_its_head_tokens_with_zero_q_elsewhere():
    target = _target()
    drafter = EagleDrafter(_network(), torch.tensor(HEAD), target)
    target.prefill(torch.tensor([1, 2, 3]))
    drafter.start(torch.tensor([1, 2, 3]))
    draft = drafter.propose(torch.tensor([4]), 4, SamplingParams(1.0), torch.Generator().manual_seed(0))
    assert len(draft) == 4 and set(draft.tokens.tolist()) <= set(HEAD)
    outside = torch.ones(CONFIG.vocab_size, dtype=torch.bool)
    outside[HEAD] = False
    assert torch.all(draft.probs[:, outside] == 0)
    torch.testing.assert_close(draft.probs.sum(dim=-1), torch.ones(4))


def test_eagle_drafter_refuses_a_mismatched_target():
    network = _network()
    other = NativeLM(NativeTransformer(dataclasses.replace(CONFIG, hidden_size=24, head_dim=12)), packing="none")
    with pytest.raises(ValueError, match="hidden size 16"):
        EagleDrafter(network, torch.tensor(HEAD), other)
    with pytest.raises(TypeError, match="native or the llama.cpp engine"):
        EagleDrafter(network, torch.tensor(HEAD), object())


def test_eagle_directory_round_trip(tmp_path):
    network = _network()
    save_eagle(tmp_path / "eagle", network, torch.tensor(HEAD), "tiny-target", None, {"note": "test"})
    assert is_eagle_draft(tmp_path / "eagle")
    loaded, output_ids, config = load_eagle(tmp_path / "eagle")
    assert output_ids.tolist() == HEAD and config["report"] == {"note": "test"}
    for name, value in network.state_dict().items():  # stored in bfloat16
        torch.testing.assert_close(loaded.state_dict()[name], value.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="'eagle' draft, not a standalone transformer"):
        load_distilled(tmp_path / "eagle")
    # the weights are as readable as the rest of the directory (safetensors alone writes them 0600)
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "eagle").iterdir()}
    assert modes["model.safetensors"] == modes["draft_config.json"], modes


def test_make_drafter_builds_an_eagle_drafter_and_refuses_a_non_native_target(tmp_path):
    save_eagle(tmp_path / "eagle", _network(), torch.tensor(HEAD), "tiny-target", None, {})
    target = _target()
    drafter = make_drafter(str(tmp_path / "eagle"), LoadedModel(target, None, None, "tiny-target"))
    assert isinstance(drafter, EagleDrafter) and drafter.target is target
    assert drafter.min_confidence == DEFAULT_MIN_CONFIDENCE
    composite = make_drafter(str(tmp_path / "eagle") + "+ngram", LoadedModel(target, None, None, "tiny-target"),
                             min_confidence=0.25)
    assert isinstance(composite.model, EagleDrafter) and composite.model.min_confidence == 0.25

    class OtherBackend:
        vocab_size = CONFIG.vocab_size

    with pytest.raises(ValueError, match="needs the target on the native or the llama.cpp engine"):
        make_drafter(str(tmp_path / "eagle"), LoadedModel(OtherBackend(), None, None, "tiny-target"))


def test_auto_with_a_bundled_eagle_draft_needs_the_native_engine_else_prompt_lookup(tmp_path, monkeypatch):
    import specdecode.pipeline as pipeline
    from specdecode.drafters import LookupThenModelDrafter, PromptLookupDrafter

    save_eagle(tmp_path / "eagle", _network(), torch.tensor(HEAD), "tiny-target", None, {})
    monkeypatch.setattr(pipeline, "bundled_draft_dir", lambda target: tmp_path / "eagle")
    from specdecode import pairs

    monkeypatch.setitem(pairs.PAIRS, "tiny-target", pairs.PAIRS["smollm2-135m-instruct"])  # the default's entry
    native = make_drafter("auto", LoadedModel(_target(), None, None, "tiny-target"))
    assert isinstance(native, LookupThenModelDrafter) and isinstance(native.model, EagleDrafter)

    class OtherBackend:
        vocab_size = CONFIG.vocab_size

    other = LoadedModel(OtherBackend(), None, None, "tiny-target")
    assert isinstance(make_drafter("auto", other), PromptLookupDrafter)
    with pytest.raises(ValueError, match="needs the target on the native or the llama.cpp engine"):  # asked for by name: an error
        make_drafter("bundled", other)


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_k=25),
                                      SamplingParams(0.9, top_p=0.6), SamplingParams(1.0, top_k=4, top_p=0.8)])
def test_q_over_the_head_widened_is_q_over_the_vocabulary(sampling):
    """The drafter samples over its K head tokens: widening that q must give the q of the -inf-widened logits."""
    from specdecode.core.sampling import probabilities
    from specdecode.drafters.distilled import widen_logits
    from specdecode.drafters.eagle import widen_probabilities

    torch.manual_seed(0)
    logits = torch.randn(len(HEAD)) * 2
    head = torch.tensor(HEAD)
    torch.testing.assert_close(widen_probabilities(probabilities(logits, sampling), head, CONFIG.vocab_size),
                               probabilities(widen_logits(logits, head, CONFIG.vocab_size), sampling))
