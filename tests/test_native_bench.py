"""The benchmark's pieces on tiny models: timing, agreement, the report and its markdown (not the real run)."""

from __future__ import annotations

import pytest
import torch
from tiny_hf import VOCAB_SIZE, tiny_llama

from specdecode.models import HFCausalLM
from specdecode.native import bench
from specdecode.native.engine import NativeLM
from specdecode.native.loading import native_from_hf_model
from specdecode.native.probe import peak_rss_mb, rss_mb

HF = tiny_llama(seed=0)


def tiny_models() -> dict:
    return {"hf": HFCausalLM(HF), "eager": NativeLM(native_from_hf_model(HF), max_cache_len=128, packing="none"),
            "int8": NativeLM(native_from_hf_model(HF), max_cache_len=128, quantize="int8")}


def test_timing_and_agreement_on_tiny_models() -> None:
    models, context = tiny_models(), torch.arange(3, 23)
    with torch.inference_mode():
        assert bench.warm_up(models["eager"], context, 4) > 0
        forward = bench.time_forward(models, context, max_k=4, reps=2, clock=bench.CLOCKS["cpu"])
        assert set(forward) == set(models) and all(set(per_k) == {1, 2, 3, 4} for per_k in forward.values())
        runners = {name: (lambda m=m: bench.generate(m, context, max_new_tokens=5, sampling=bench.GREEDY).token_ids)
                   for name, m in models.items()}
        greedy = bench.time_greedy(runners, reps=2)
        assert greedy["hf"]["token_ids"] == greedy["eager"]["token_ids"] and greedy["eager"]["tokens_per_s"] > 0
        sequences = [torch.randint(3, VOCAB_SIZE, (30,), generator=torch.Generator().manual_seed(i)) for i in range(2)]
        agreement = bench.top1_agreement(models, models["eager"], sequences)
    assert agreement["eager"] == 1.0 and agreement["hf"] == 1.0 and 0.8 <= agreement["int8"] <= 1.0


def fake_report() -> dict:
    ks = list(range(1, 9))
    forward = {"default": {k: 0.040 * (1 + 0.1 * (k - 1)) for k in ks}, "int8": {k: 0.030 * k for k in ks}}
    return {
        "command": "--quick", "date": "2026-01-01", "model": "tiny", "threads": 2, "clock": "wall", "torch": "x",
        "machine": "cpu", "context": 20, "ks": ks, "reps": 3, "new_tokens": 8, "greedy_reps": 1,
        "agreement_positions": 60, "variants": ["hf-generate", "default", "int8"], "draft": "truncated:2",
        "forward_seconds": forward,
        "greedy": {"hf-generate": {"tokens_per_s": 10.0, "token_ids": [1, 2, 3]},
                   "default": {"tokens_per_s": 35.0, "token_ids": [1, 2, 3]},
                   "int8": {"tokens_per_s": 20.0, "token_ids": [1, 5, 3]}},
        "top1_agreement": {"default": 1.0, "int8": 0.95},
        "fp32_weight_bytes": 512 * 2**20, "fp32_streaming_seconds": 0.032,
        "ttft": {"default": {"imports_s": 3.0, "load_s": 1.0, "prefill_s": 0.2, "ttft_s": 4.2, "cpu_s": 4.0}},
        "rss": {"int8": {"packing": "none", "imports_mb": 370, "target_mb": 530, "target_draft_mb": 570,
                         "after_generate_mb": 590, "peak_mb": 1500}},
    }


def test_targets_and_markdown_from_a_report() -> None:
    report = fake_report()
    checks = {c["target"]: c for c in bench.target_checks(report)}
    assert checks["greedy tok/s >= 3x HF generate (default)"]["met"] is True  # 3.5x
    assert checks["T(5)/T(1) <= 1.3 (default)"]["measured"] == "1.40" and not checks["T(5)/T(1) <= 1.3 (default)"]["met"]
    assert checks["TTFT warm < 5 s (default)"]["met"] and checks["RSS target + draft < 1.5 GB (int8)"]["met"]
    report["targets"] = list(checks.values())
    text = bench.markdown(report)
    assert "| default | native float32" in text and "| int8 |" in text and "T(16)/T(1)" in text
    assert "| hf-generate | transformers" in text and "| False |" in text  # int8's tokens differ
    assert "16.8 GB/s" in text and "at most 3.1x HF generate" in text
    assert "## Time to first token" in text and "## Resident memory, target + draft (truncated:2)" in text


def test_bad_bench_arguments_are_named() -> None:
    with pytest.raises(SystemExit):
        bench._parse(["--variants", "eager,turbo"])
    with pytest.raises(SystemExit):
        bench._parse(["--clock", "cpu"])  # needs --threads 1
    args = bench._parse(["--quick", "--with-compile", "--threads", "1", "--clock", "cpu"])
    assert args.names[-1] == "compiled" and args.names[0] == "hf-generate"


def test_memory_readings_are_plausible() -> None:
    assert 10 < rss_mb() <= peak_rss_mb() + 1


@pytest.mark.slow
@pytest.mark.real_model
def test_rss_probe_runs_the_bundled_eagle_draft():
    """The probe's default draft is the bundled one, an EAGLE draft: it drafts on the target's features."""
    from specdecode.native.probe import run_probe

    result = run_probe("rss", "--draft", "bundled", "--new-tokens", "4")
    assert result["draft_packing"].startswith("eagle") and result["target_draft_mb"] >= result["target_mb"]
