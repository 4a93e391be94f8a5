"""`specdecode bench`: Spec-Bench-style measurement of speculative decoding against the target alone.

    from specdecode.bench import BenchConfig, run_bench
    results = run_bench(BenchConfig(prompts="../shared/data/spec_bench_dev.jsonl", out="bench-out", quick=True))

Modules, one job each: prompts (loading tasks), measure (interleaved runs), methods (specdecode's
drafters), peers (HF generate), costs (extend timings), stats (pure statistics), summary (tables'
numbers), report (markdown), plots (PNG), run (orchestration), cli (the commands).
"""

from specdecode.bench.config import BenchConfig
from specdecode.bench.run import run_bench, write_outputs

__all__ = ["BenchConfig", "run_bench", "write_outputs"]
