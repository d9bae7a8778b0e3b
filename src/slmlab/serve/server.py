"""From a run or checkpoint to a running server: load the model, find its end-of-text ids, decide
between continuous batching and a one-at-a-time queue, build the worker and the routes, and serve
them with uvicorn until a signal stops both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .app import build_app
from .batch import batching_refusal
from .http import DEFAULT_MAX_REQUEST_BYTES, check_api_key
from .routes import ServedModel
from .worker import Worker


@dataclass
class Server:
    """A built server: ``app`` (FastAPI; run it with uvicorn), its ``worker`` and what it serves.

    ``batching_refusal`` is None when requests are batched, else why they queue;
    ``trained_context`` the sequence length the model was trained on (None if not recorded).
    """

    app: object
    worker: Worker
    served: ServedModel
    checkpoint: Path
    batching_refusal: str | None
    trained_context: int | None = None

    def describe(self) -> list[str]:
        """The start-up lines: what is served, and how concurrent requests are handled."""
        model = self.served.model
        params = sum(p.numel() for p in model.parameters())
        trained = f", trained on {self.trained_context}" if self.trained_context is not None else ""
        head = (f"{self.served.name} ({model.config.model_type}, {params:,} parameters, context {self.served.context}"
                f"{trained}) from {self.checkpoint}")
        if self.batching_refusal is None:
            mode = (f"continuous batching: up to {self.worker.max_batch} requests decode together (left-padded rows"
                    " over the family's cache)")
        else:
            mode = f"one request at a time, the others queue: {self.batching_refusal}"
        return [head, mode]

    def run(self, host: str, port: int, log_level: str = "warning", shutdown_grace: float = 5.0) -> None:
        """Serve on ``host:port`` until SIGINT/SIGTERM. The signal also stops the model worker, which
        answers every request it holds or that waits with 503 at once, so no open connection keeps the
        shutdown waiting (any still open after ``shutdown_grace`` seconds is cancelled by uvicorn)."""
        import uvicorn

        worker = self.worker

        class _Uvicorn(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                worker.shutdown()
                super().handle_exit(sig, frame)

        _Uvicorn(uvicorn.Config(self.app, host=host, port=port, log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=shutdown_grace)).run()


def build_server(run: str | Path, max_batch: int = 8, max_queue: int = 64, api_key: str | None = None,
                 model_name: str | None = None, device: str = "auto",
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, quantize: str | None = None) -> Server:
    """Load ``run`` (a run folder, checkpoint or saved model with its tokenizer) and build the server;
    ``quantize="int8"`` (or ``"int4"``) swaps its linear layers for quantized ones (:func:`slmlab.models.quantize.apply_quantization`).

    Raises:
        ValueError: no tokenizer saved with the model, bad limits, an empty API key or a model name
            that is not valid UTF-8.
    """
    from ..models.quantize import apply_quantization
    from ..train.saved import load_for_inference

    if max_batch < 1 or max_queue < 1:
        raise ValueError(f"max_batch and max_queue must be >= 1, got {max_batch} and {max_queue}")
    if max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes must be >= 1, got {max_request_bytes}")
    check_api_key(api_key)
    loaded = load_for_inference(run, device)
    ckpt, model, tokenizer = loaded.checkpoint, loaded.model, loaded.tokenizer
    apply_quantization(model, quantize, loaded.device)
    if tokenizer is None:
        raise ValueError(f"{ckpt} has no tokenizer.json; serve a run or checkpoint saved with its tokenizer")
    stop_ids = end_of_text_ids(model.config, tokenizer)
    refusal = "--max-batch 1" if max_batch == 1 else batching_refusal(model)
    name = model_name or run_name(run, ckpt)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a path of undecodable bytes: no response could carry it
        raise ValueError(f"the model name {name!r} is not valid UTF-8; pass --model-name") from None
    served = ServedModel(name, model, tokenizer, stop_ids, model.max_positions())
    worker = Worker(model, stop_ids, max_batch, max_queue, batched=refusal is None)
    return Server(build_app(served, worker, api_key, max_request_bytes), worker, served, ckpt, refusal,
                  loaded.trained_context)


def end_of_text_ids(config, tokenizer) -> list[int]:
    """The token ids that end a completion: the config's ``eos_token_id`` (an id or a list) where it
    names ids inside the vocabulary, else the tokenizer's end-of-text token."""
    eos = getattr(config, "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    ids = [i for i in ids if isinstance(i, int) and 0 <= i < config.vocab_size]
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    return ids


def run_name(path: str | Path, ckpt: Path) -> str:
    """The model id clients send: the run folder's name (not ``step_000100`` or ``checkpoints``)."""
    folder = Path(path).resolve()
    if folder.name.startswith("step_"):
        folder = folder.parent
    if folder.name == "checkpoints":
        folder = folder.parent
    return folder.name or ckpt.name


def check_address(host: str, port: int) -> None:
    """Refuse an address that cannot be bound before the model is loaded (a port in use, a host that
    is not this machine's)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(infos[0][4])
    except OSError as err:
        raise ValueError(f"cannot listen on {host}:{port} ({err.strerror or err}); pick another --port, or stop the"
                         " program using it") from None
