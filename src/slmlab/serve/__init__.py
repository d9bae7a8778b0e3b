"""``slmlab serve``: an OpenAI-compatible HTTP server for every family (FastAPI + uvicorn, extra ``serve``).

* :mod:`.server` - from a checkpoint to a running server (:func:`build_server`, ``Server.run``);
* :mod:`.app` - the FastAPI app: routes, error handlers, the worker's lifespan;
* :mod:`.routes` - what each route reads, checks, queues and answers (whole or streamed);
* :mod:`.http` - errors as JSON, the API-key middleware, bounded request bodies, server-sent events;
* :mod:`.worker` - the single model worker: continuous batching or a one-at-a-time queue;
* :mod:`.batch` - the decoding batch (the shared decoder on the forward path) and its start-up probe;
* :mod:`.schemas` / :mod:`.errors` - request validation and OpenAI-format errors;
* :mod:`.chat` - the plain chat template (streamed text with stop strings: :mod:`slmlab.generation.text`).

Importing the package does not import FastAPI; :mod:`.app` does (the ``serve`` extra).
"""

from .batch import CannotBatch, DecodeBatch, batching_refusal
from .chat import render_chat
from .errors import APIError
from .worker import Worker

__all__ = ["APIError", "CannotBatch", "DecodeBatch", "Worker", "batching_refusal", "render_chat"]
