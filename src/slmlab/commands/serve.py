"""``slmlab serve``: an OpenAI-compatible HTTP server; the work is in :mod:`slmlab.serve`."""

from __future__ import annotations

import sys

from ._common import add_quantize_argument, command_parser


def serve_command(argv: list[str]) -> int:
    """Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, batching).

    RUN is a run folder (its newest checkpoint), a checkpoint folder or a saved model with its
    tokenizer. Routes: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions.
    Concurrent requests are decoded together (continuous batching, up to --max-batch rows) when the
    family's cache takes left padding; otherwise they queue and run one at a time (said at start-up).
    Needs the `serve` extra (pip install 'slmlab[serve]'). Details: docs/serve.md.
    Examples:
      slmlab serve runs/quickstart
      slmlab serve runs/quickstart --port 8080 --max-batch 16 --api-key secret
      curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
           -d '{"prompt": "ROMEO:", "max_tokens": 32, "temperature": 0}'
    """
    p = command_parser(serve_command, "serve")
    p.add_argument("run")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=8, help="rows decoded together (1 = one request at a time)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a row; more get 503")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes (an empty"
                   " key is refused)")
    p.add_argument("--max-request-bytes", type=int, default=4 * 1024 * 1024,
                   help="largest request body; larger ones get 413 (default 4 MiB)")
    p.add_argument("--shutdown-grace", type=float, default=5.0,
                   help="seconds open connections get to close after SIGINT/SIGTERM (default 5)")
    p.add_argument("--model-name", default=None, help="the model id clients send (default: the run folder's name)")
    p.add_argument("--device", default="auto")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    add_quantize_argument(p)
    args = p.parse_args(argv)
    for name in ("max_batch", "max_queue"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}; pass 0 for torch's default")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes must be >= 1, got {args.max_request_bytes}")
    if not args.shutdown_grace >= 0:
        raise ValueError(f"--shutdown-grace must be >= 0 seconds, got {args.shutdown_grace}")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ValueError("slmlab serve needs FastAPI and uvicorn; install the extra: pip install 'slmlab[serve]'") from None
    from ..serve.http import check_api_key
    from ..serve.server import build_server, check_address

    check_api_key(args.api_key)  # before the model is loaded: `--api-key "$UNSET"` must not serve openly
    check_address(args.host, args.port)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    server = build_server(args.run, args.max_batch, args.max_queue, args.api_key, args.model_name, args.device,
                          args.max_request_bytes, quantize=args.quantize)
    head, mode = server.describe()
    print(f"slmlab serve: {head}; {torch.get_num_threads()} threads", file=sys.stderr)
    print(f"slmlab serve: {mode}", file=sys.stderr)
    print(f"slmlab serve: listening on http://{args.host}:{args.port}/v1{' (API key required)' if args.api_key else ''}",
          file=sys.stderr, flush=True)
    server.run(args.host, args.port, args.log_level, args.shutdown_grace)
    return 0

