"""OpenAI-compatible HTTP server with speculative decoding, streaming and Prometheus metrics.

    >>> from specdecode.pipeline import Pipeline
    >>> from specdecode.server import ServerConfig, create_app, serve
    >>> serve(Pipeline.load(), ServerConfig(max_queue=32), port=8000)   # or: specdecode serve

Modules: `schemas` (pydantic bodies), `errors` (OpenAI error bodies), `worker` (the
model threads and their queue), `engine` (prompts, drafters, one generation),
`metrics` (Prometheus + JSON), `app` (routes), `run` (uvicorn with graceful shutdown).
"""

from specdecode.server.app import ServerConfig, create_app
from specdecode.server.run import Server, serve

__all__ = ["ServerConfig", "create_app", "Server", "serve"]
