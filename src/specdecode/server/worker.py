"""Model threads fed by an asyncio queue: up to `concurrency` generations at once, a bounded number waiting.

With concurrency 1 every generation runs on the same single thread (a model is not thread-safe). With more,
each running generation has a thread of its own, and the engine batches their forward passes
(`native.batching`). Requests become `Job`s; a dispatcher task takes them from an asyncio queue in order and
starts each on a thread, which reports back through the job's event queue (text deltas, then one terminal
event). A job can be cancelled at any time: a waiting job is skipped, a running one stops between two token
chunks.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from specdecode.decoding import GenerationResult
from specdecode.models.base import ContextLengthError
from specdecode.server.errors import APIError

__all__ = ["Job", "Delta", "Finished", "Failed", "Cancelled", "Worker"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delta:
    """A piece of generated text."""

    text: str


@dataclass(frozen=True)
class Finished:
    """The generation ended normally; `text` is the whole completion."""

    text: str
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    error: APIError


@dataclass(frozen=True)
class Cancelled:
    """The generation was stopped (client gone)."""


Event = Delta | Finished | Failed | Cancelled
_TERMINAL = (Finished, Failed, Cancelled)


class Job:
    """One generation request: its parameters, timings, cancellation flag and event stream."""

    _ids = itertools.count(1)

    def __init__(self, request: object, loop: asyncio.AbstractEventLoop) -> None:
        self.number = next(self._ids)
        self.request = request
        self.created = time.perf_counter()
        self.started: float | None = None
        self.first_token: float | None = None
        self.finished: float | None = None
        self.generated_tokens = 0  # streamed so far (also known for cancelled jobs)
        self.outcome: Event | None = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._cancel_error: APIError | None = None
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()

    # -- any thread
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, error: APIError | None = None) -> None:
        """Stop the generation; with `error`, the client (if still there) is told why."""
        if not self._cancelled.is_set():
            self._cancel_error = error
            self._cancelled.set()

    def emit(self, event: Event) -> None:
        """Report an event to the waiting client (thread-safe; the first terminal event wins)."""
        if isinstance(event, _TERMINAL):
            with self._lock:
                if self.outcome is not None:
                    return
                self.outcome = event
                self.finished = time.perf_counter()
        self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    def end_cancelled(self) -> None:
        """Terminal event for a cancelled job: the cancel error if there is one, else `Cancelled`."""
        self.emit(Failed(self._cancel_error) if self._cancel_error else Cancelled())

    # -- event loop
    async def events(self) -> AsyncIterator[Event]:
        """Events until (and including) the terminal one."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, _TERMINAL):
                return

    async def wait(self) -> Event:
        """The terminal event (deltas are skipped)."""
        async for event in self.events():
            if isinstance(event, _TERMINAL):
                return event
        raise AssertionError("unreachable")


class Worker:
    """Runs `run(job)` for each submitted job, in order of arrival, up to `concurrency` at once, each on a thread.

    Capacity: `max_queue` jobs waiting plus the `concurrency` running; beyond it `submit` raises a 429.
    Loop-side state (the waiting jobs, the running ones) is only touched from the event loop.
    on_submit(waiting): called with the jobs waiting after each accepted submission (metrics).
    """

    def __init__(
        self, run: Callable[[Job], None], *, max_queue: int, on_done: Callable[[Job], None] | None = None,
        concurrency: int = 1, on_submit: Callable[[int], None] | None = None,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        self._run = run
        self._on_done = on_done
        self._on_submit = on_submit
        self.max_queue = max_queue
        self.concurrency = concurrency
        self._pending: set[Job] = set()  # submitted, not yet taken by the dispatcher
        self._running: set[Job] = set()
        self.accepting = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Job | None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._dispatcher: asyncio.Task | None = None
        self._free: asyncio.Semaphore | None = None  # one per thread not running a job
        self._idle: asyncio.Event | None = None
        self._go = threading.Event()
        self._go.set()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Jobs waiting to run; one cancelled while it waits (its client left) no longer counts, and the
        dispatcher skips it."""
        return sum(not job.cancelled for job in self._pending)

    # -- lifecycle (event loop)
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._idle = asyncio.Event()
        self._idle.set()
        self._free = asyncio.Semaphore(self.concurrency)
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="specdecode-model")
        self._dispatcher = asyncio.create_task(self._dispatch(), name="specdecode-dispatcher")
        self.accepting = True

    def begin_shutdown(self) -> None:
        """Refuse new jobs (503) and fail the waiting ones; the running job goes on."""
        self.accepting = False
        error = APIError(503, "the server is shutting down", code="shutting_down")
        while self._queue is not None and not self._queue.empty():
            job = self._queue.get_nowait()
            if job is not None:
                self._pending.discard(job)
                job.cancel(error)
                self._finish(job)
        if self._queue is not None:
            self._queue.put_nowait(None)  # wakes the dispatcher so it can end

    async def drain(self, grace: float) -> None:
        """begin_shutdown, let the running jobs finish for up to `grace` seconds, then cancel them."""
        self.begin_shutdown()
        if self._idle is None or self._idle.is_set():
            return
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=grace)
        except TimeoutError:
            for job in list(self._running):
                logger.warning("cancelling generation %d at shutdown", job.number)
                job.cancel(APIError(503, "the server shut down during generation", code="shutting_down"))
            self._go.set()
            await self._idle.wait()

    async def close(self, grace: float = 0.0) -> None:
        """drain, then stop the dispatcher and the thread."""
        await self.drain(grace)
        if self._dispatcher is not None:
            await self._dispatcher
            self._dispatcher = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- requests (event loop)
    def submit(self, request: object) -> Job:
        """Queue a job for `request`; 503 when not accepting, 429 when the queue is full."""
        if not self.accepting or self._queue is None:
            raise APIError(503, "the server is not ready or is shutting down", code="unavailable")
        if self.waiting + self.running >= self.max_queue + self.concurrency:
            raise APIError(
                429, f"too many requests: {self.waiting} waiting (limit {self.max_queue}); retry later",
                code="queue_full",
            )
        job = Job(request, asyncio.get_running_loop())
        self._pending.add(job)
        self._queue.put_nowait(job)
        if self._on_submit is not None:
            self._on_submit(self.waiting)
        return job

    # -- pausing (any thread): hold jobs before they start, e.g. for maintenance or tests
    def pause(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    # -- internals
    async def _dispatch(self) -> None:
        assert self._queue is not None and self._idle is not None and self._free is not None
        tasks: set[asyncio.Task] = set()
        while True:
            await self._free.acquire()  # a thread is free: take the next job
            job = await self._queue.get()
            if job is None:
                self._free.release()
                if not self.accepting:
                    if tasks:
                        await asyncio.gather(*tasks, return_exceptions=True)
                    return
                continue
            self._pending.discard(job)
            if job.cancelled:  # the client left while waiting
                self._free.release()
                self._finish(job)
                continue
            self._running.add(job)
            self._idle.clear()
            task = asyncio.create_task(self._execute(job), name=f"specdecode-job-{job.number}")
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _execute(self, job: Job) -> None:
        """Run the job on a thread of the executor; then free that thread for the next job."""
        assert self._free is not None and self._idle is not None
        try:
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(self._executor, self._run_job, job))
        except Exception as error:  # the thread reports its own errors; this is a last resort
            logger.exception("generation %d failed", job.number)
            job.emit(Failed(APIError(500, f"generation failed: {error}")))
        finally:
            self._running.discard(job)
            self._finish(job)
            self._free.release()
            if not self._running:
                self._idle.set()

    def _run_job(self, job: Job) -> None:
        """On the model thread."""
        self._go.wait()
        job.started = time.perf_counter()
        if job.cancelled:
            job.end_cancelled()
            return
        try:
            self._run(job)
        except APIError as error:
            job.emit(Failed(error))
        except ContextLengthError as error:  # a prompt the model cannot take: the request's fault
            job.emit(Failed(APIError(400, str(error), code="context_length_exceeded")))
        except Exception as error:  # one request's failure never takes the server down
            logger.exception("generation %d failed", job.number)
            job.emit(Failed(APIError(500, f"generation failed: {type(error).__name__}: {error}")))
        if job.outcome is None:
            job.end_cancelled()

    def _finish(self, job: Job) -> None:
        """Make sure the job has ended, then report it (metrics)."""
        if job.outcome is None:
            job.end_cancelled()
        if self._on_done is not None:
            try:
                self._on_done(job)
            except Exception:
                logger.exception("recording job %d failed", job.number)
