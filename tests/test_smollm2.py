"""The real default model, SmolLM2-135M-Instruct from its GGUF file: greedy identity on Spec-Bench prompts.

Slow (the first run converts the GGUF file, ~40 s; later runs load the cached
safetensors in about a second) but part of CI.
"""

import json

import pytest
import torch
from conftest import SHARED_DATA

from specdecode.cli import main
from specdecode.core.sampling import SamplingParams
from specdecode.models.loading import load_model
from specdecode.pipeline import Pipeline

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

GREEDY = SamplingParams(0.0)


@pytest.fixture(scope="module")
def pipeline():
    # the default target and draft ('auto': the bundled EAGLE draft with prompt lookup) on the native engine, which the
    # EAGLE draft reads; test_llamacpp.py has the llama.cpp engine
    return Pipeline.load(backend="native")


def spec_bench_prompts(count):
    lines = (SHARED_DATA / "spec_bench_dev.jsonl").read_text().splitlines()
    step = len(lines) // count  # spread over the categories
    return [json.loads(line)["turns"][0] for line in lines[::step][:count]]


def test_default_model_shape(pipeline):
    config = pipeline.target.hf_model.config  # a transformers config on either backend
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert pipeline.target.model.vocab_size == 49152 and config.tie_word_embeddings
    assert pipeline.eos_token_ids() == {2}  # <|im_end|>


def test_greedy_identity_on_spec_bench_prompts(pipeline):
    """Speculative (default draft) greedy output equals plain greedy output, token for token: 10 prompts x 64 tokens."""
    accepted = 0
    for prompt in spec_bench_prompts(10):
        ids = pipeline.encode(prompt)
        spec = pipeline.generate(ids, max_new_tokens=64, sampling=GREEDY)
        base = pipeline.generate(ids, max_new_tokens=64, sampling=GREEDY, speculative=False)
        assert spec.token_ids == base.token_ids, f"greedy outputs differ for {prompt[:60]!r}"
        accepted += spec.stats.accepted_tokens
    assert accepted > 0  # the drafter did take part


def test_plain_loop_matches_transformers_generate(pipeline):
    ids = pipeline.encode(spec_bench_prompts(10)[3])
    ours = pipeline.generate(ids, max_new_tokens=32, sampling=GREEDY, speculative=False).token_ids
    hf_model = load_model().hf_model  # transformers' own generate, whatever backend the pipeline runs on
    with torch.inference_mode():
        theirs = hf_model.generate(ids[None], max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    assert ours == theirs[: len(ours)]


def test_self_draft_accepts_everything():
    """The target as its own draft: alpha is 1 and a round yields gamma + 1 tokens."""
    from specdecode.drafters import ModelDrafter
    pipe = Pipeline.load(draft="none", gamma=3, backend="native")
    pipe.drafter = ModelDrafter(load_model().model)
    result = pipe.generate(pipe.encode("Count from one to twenty in words."), max_new_tokens=24, sampling=GREEDY)
    assert result.stats.alpha == 1.0


def test_cli_compare_json_on_default_model(capsys):
    assert main(["generate", "--compare", "--json", "--max-new-tokens", "24", "Repeat after me: red, green, blue, red, green, blue."]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["identical"] is True and record["speedup"] > 0
    assert record["stats"]["target_calls"] >= 1 and record["text"]
