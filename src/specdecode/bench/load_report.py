"""The load test's table (scripts/load_test.py): a row per (server, clients), from the runs of its results.json."""

from __future__ import annotations

import math

__all__ = ["OURS", "load_test_table", "runs_of"]

OURS = "specdecode serve"


def _server(run: dict) -> str:
    """The server a run measured (results written before peers were measured have no field: ours)."""
    return run.get("server", OURS)


def runs_of(results: dict) -> list[dict]:
    """A results.json's runs, each with the --backend of our server (older files record it in args only)."""
    backend = results.get("args", {}).get("backend")
    backend = None if backend in (None, "None") else backend  # args are stored as strings
    return [{"backend": backend, **run} for run in results["runs"]]


def load_test_table(runs: list[dict]) -> str:
    """A markdown row per (server, clients), with the throughput and TTFT over our first server's at those clients."""
    ours = [r for r in runs if _server(r) == OURS] or runs
    first = {r["clients"]: r for r in ours if r["max_batch"] == ours[0]["max_batch"]}
    lines = ["| server | clients | requests | errors | mismatches | tokens/s | x first | latency p50 / p95 s "
             "| TTFT p50 / p95 s | TTFT p95 / first's | tokens per target call |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def name(run: dict) -> str:
        if _server(run) != OURS:
            return _server(run)
        backend = f" --backend {run['backend']}" if run.get("backend") else ""
        return f"{OURS}{backend} --max-batch {run['max_batch'] or 'default'}"

    for r in runs:
        base = first.get(r["clients"], r)
        speed = r["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else math.nan
        ttft = r["ttft_p95_s"] / base["ttft_p95_s"] if base["ttft_p95_s"] else math.nan
        per_call = r.get("server_tokens_per_target_call")
        lines.append(
            f"| {name(r)} | {r['clients']} | {r['requests']} | {r['errors']} | {r['mismatches']} | "
            f"{r['tokens_per_s']:.1f} | {speed:.2f}x | {r['latency_p50_s']:.1f} / {r['latency_p95_s']:.1f} | "
            f"{r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f} | {ttft:.2f} | "
            f"{'' if per_call is None else f'{per_call:.2f}'} |")
    return "\n".join(lines) + "\n"
