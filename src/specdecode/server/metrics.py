"""Prometheus metrics (one CollectorRegistry per app) and the same numbers as JSON."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdecode.server.worker import Cancelled, Failed, Finished, Job

__all__ = ["Metrics", "RequestMetricsMiddleware", "PROMETHEUS_CONTENT_TYPE"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_COUNT_BUCKETS = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class Metrics:
    """Counters and histograms of the server, in their own registry (never the global one)."""

    def __init__(self, waiting: Callable[[], float] = lambda: 0, running: Callable[[], float] = lambda: 0) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdecode_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r)
        self.request_seconds = Histogram(
            "specdecode_request_duration_seconds", "HTTP request latency (whole stream for streamed responses)",
            ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.generations = Counter(
            "specdecode_generations", "generations by draft and finish reason (eos, stop, length, context, cancelled, error)",
            ["draft", "finish_reason"], registry=r,
        )
        self.prompt_tokens = Counter("specdecode_prompt_tokens", "prompt tokens of generations that ran", registry=r)
        self.completion_tokens = Counter("specdecode_completion_tokens", "tokens generated", registry=r)
        self.target_calls = Counter("specdecode_target_calls", "target forward passes (prefill included)", registry=r)
        self.draft_proposed = Counter(
            "specdecode_draft_tokens_proposed", "draft tokens that reached draft position i (1-based) and were evaluated",
            ["draft", "position"], registry=r,
        )
        self.draft_accepted = Counter(
            "specdecode_draft_tokens_accepted", "draft tokens accepted at draft position i (1-based)",
            ["draft", "position"], registry=r,
        )
        self.ttft = Histogram(
            "specdecode_time_to_first_token_seconds", "request arrival to first generated token (queueing included)",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.queue_wait = Histogram(
            "specdecode_queue_wait_seconds", "request arrival to start of generation", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tokens_per_second = Histogram(
            "specdecode_generation_tokens_per_second", "generated tokens per second of generation time, per request",
            buckets=_RATE_BUCKETS, registry=r,
        )
        self.batch_sequences = Histogram(
            "specdecode_batch_sequences", "sequences per target forward pass (prefills apart)", buckets=_COUNT_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "specdecode_batch_rows", "token rows per target forward pass: each sequence's last token and draft",
            buckets=_COUNT_BUCKETS, registry=r,
        )
        self.queue_length = Histogram(
            "specdecode_queue_length", "requests waiting, seen by each accepted request", buckets=_COUNT_BUCKETS,
            registry=r,
        )
        Gauge("specdecode_requests_waiting", "requests queued for the model", registry=r).set_function(waiting)
        Gauge("specdecode_requests_running", "requests being generated", registry=r).set_function(running)

    # -- recording
    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.request_seconds.labels(endpoint).observe(seconds)

    def observe_pass(self, sequences: int, rows: int) -> None:
        """A batched forward pass over `rows` token rows of `sequences` sequences (any thread)."""
        self.batch_sequences.observe(sequences)
        self.batch_rows.observe(rows)

    def observe_queue(self, waiting: int) -> None:
        self.queue_length.observe(waiting)

    def observe_job(self, job: Job) -> None:
        """Record a finished, failed or cancelled generation."""
        draft = getattr(job.request, "draft", "none")
        outcome = job.outcome
        if isinstance(outcome, Finished):
            reason = outcome.result.finish_reason
        else:
            # a server fault is an error; a client that left, or the server shutting down, cancels
            failed = isinstance(outcome, Failed) and outcome.error.status >= 500 and outcome.error.code != "shutting_down"
            reason = "error" if failed else "cancelled"
        self.generations.labels(draft, reason).inc()
        if job.started is None or (isinstance(outcome, Cancelled | Failed) and job.first_token is None):
            return  # never ran
        self.prompt_tokens.inc(len(getattr(job.request, "prompt_ids", ())))
        self.completion_tokens.inc(job.generated_tokens)
        self.queue_wait.observe(job.started - job.created)
        if job.first_token is not None:
            self.ttft.observe(job.first_token - job.created)
        if isinstance(outcome, Finished):
            stats = outcome.result.stats
            self.target_calls.inc(stats.target_calls)
            for i, (proposed, accepted) in enumerate(zip(stats.proposed_per_position, stats.accepted_per_position)):
                self.draft_proposed.labels(draft, str(i + 1)).inc(proposed)
                self.draft_accepted.labels(draft, str(i + 1)).inc(accepted)
            if stats.new_tokens:
                self.tokens_per_second.observe(stats.tokens_per_s)

    # -- reading
    def exposition(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)

    def snapshot(self) -> dict:
        """Every metric as JSON: {name: {type, help, samples}}, histograms as {labels, count, sum, buckets}."""
        out: dict = {}
        for family in self.registry.collect():
            if family.type == "histogram":
                samples = _histogram_samples(family.name, family.samples)
            else:
                samples = [
                    {"labels": dict(s.labels), "value": s.value}
                    for s in family.samples
                    if not s.name.endswith("_created")
                ]
            out[family.name] = {"type": family.type, "help": family.documentation, "samples": samples}
        out["acceptance_by_position"] = self._acceptance()
        return out

    def _acceptance(self) -> dict[str, list[float | None]]:
        """Per draft: accepted / proposed at each draft position (the empirical alpha by position)."""
        table: dict[str, dict[int, list[float]]] = {}
        for metric, slot in ((self.draft_proposed, 0), (self.draft_accepted, 1)):
            for family in metric.collect():
                for s in family.samples:
                    if s.name.endswith("_total"):
                        cell = table.setdefault(s.labels["draft"], {}).setdefault(int(s.labels["position"]), [0.0, 0.0])
                        cell[slot] = s.value
        return {
            draft: [(acc / prop if prop else None) for prop, acc in (positions[i] for i in sorted(positions))]
            for draft, positions in table.items()
        }


def _histogram_samples(name: str, samples: Iterable) -> list[dict]:
    groups: dict[tuple, dict] = {}
    for s in samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        group = groups.setdefault(tuple(sorted(labels.items())), {"labels": labels, "count": 0.0, "sum": 0.0, "buckets": {}})
        if s.name == f"{name}_bucket":
            group["buckets"][s.labels["le"]] = s.value
        elif s.name == f"{name}_count":
            group["count"] = s.value
        elif s.name == f"{name}_sum":
            group["sum"] = s.value
    return list(groups.values())


class RequestMetricsMiddleware:
    """Pure ASGI middleware (streaming-safe): counts requests by endpoint and status, times them."""

    def __init__(self, app: ASGIApp, metrics: Metrics, endpoints: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = frozenset(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope.get("path", "")
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            endpoint = path if path in self.endpoints else "other"
            self.metrics.observe_request(endpoint, status, time.perf_counter() - start)
