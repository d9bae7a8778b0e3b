"""``slmlab serve``: an OpenAI-compatible HTTP server for every family (FastAPI + uvicorn, extra ``serve``).

* :mod:`.server` - from a checkpoint to a ready app (:func:`build_server`);
* :mod:`.app` - the routes, streaming and errors;
* :mod:`.worker` - the single model worker: continuous batching or a one-at-a-time queue;
* :mod:`.batch` - joining and leaving a decoding batch over the family's own cache;
* :mod:`.schemas` / :mod:`.errors` - request validation and OpenAI-format errors;
* :mod:`.chat` - the plain chat template; :mod:`.text` - streamed text with stop strings.

Importing the package does not import FastAPI; :mod:`.app` does (the ``serve`` extra).
"""

from .batch import CannotBatch, DecodeBatch, batching_refusal
from .chat import render_chat
from .errors import APIError
from .worker import Worker

__all__ = ["APIError", "CannotBatch", "DecodeBatch", "Worker", "batching_refusal", "render_chat"]
