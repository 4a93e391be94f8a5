"""Running the app under uvicorn with a graceful shutdown that drains the model worker first."""

from __future__ import annotations

import contextlib
import socket

import uvicorn

from specdecode.pipeline import Pipeline
from specdecode.server.app import ServerConfig, create_app

__all__ = ["Server", "serve"]


class Server(uvicorn.Server):
    """uvicorn.Server whose shutdown first drains the worker of `config.app` (a `create_app` app).

    While draining, new requests get 503 and waiting ones are failed with 503; the running
    generation has the app's `shutdown_grace` seconds to finish before it is cancelled
    (its client then receives an error). Then uvicorn closes the connections as usual.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(self.config.app, "state", None)
        worker = getattr(state, "worker", None)
        if worker is not None:
            await worker.drain(state.config.shutdown_grace)
        await super().shutdown(sockets)


def serve(pipeline: Pipeline, config: ServerConfig = ServerConfig(), *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info") -> None:
    """Serve `pipeline` until interrupted (SIGINT/SIGTERM), then shut down gracefully."""
    app = create_app(pipeline, config)
    uv_config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT once it has shut down
        Server(uv_config).run()
