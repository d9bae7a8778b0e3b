"""``slmlab generate``: stream a continuation through :func:`slmlab.generation.generate`."""

from __future__ import annotations

import sys

from ._common import add_max_new_tokens_argument, add_quantize_argument, command_parser, parse_token_ids, utf8_text

# Batch-1 decode of the default presets (a few million parameters) is a chain of small GEMVs: a
# second thread costs more in synchronisation than it saves (docs/cli.md, `slmlab generate`).
DEFAULT_THREADS = 1


def generate_command(argv: list[str]) -> int:
    """Stream a continuation from a trained run or checkpoint (works for every family).

    RUN is a run folder (its newest checkpoint is used), a checkpoint folder, or any saved model.
    Examples:
      slmlab generate runs/quickstart --prompt "ROMEO:" --max-new-tokens 200
      slmlab generate runs/mqar --prompt-ids 5,600,7,700 --temperature 0
    """
    p = command_parser(generate_command, "generate")
    p.add_argument("run")
    p.add_argument("--prompt", default=None, help="text prompt (needs the tokenizer saved with the model)")
    p.add_argument("--prompt-ids", default=None, help="comma-separated token ids instead of text")
    add_max_new_tokens_argument(p, 200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--truncate-prompt", action="store_true",
                   help="drop the prompt's oldest tokens (with a warning) when it leaves no room for new tokens")
    p.add_argument("--compile", action="store_true",
                   help="compile the decode plan's step (Lumen, LFM2): on a CPU packaged by AOTInductor and cached in"
                        " $SLMLAB_CACHE/decode-steps (tens of CPU-seconds once per layout, ~1 s on later starts),"
                        " elsewhere torch.compile")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"torch CPU threads (default {DEFAULT_THREADS}: batch-1 decode of these model sizes is fastest on"
                        " one thread; 0 = torch's default, one per core)")
    add_quantize_argument(p)
    args = p.parse_args(argv)
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    prompt_ids = parse_token_ids(args.prompt_ids) if args.prompt_ids is not None else None
    prompt = utf8_text(args.prompt, "--prompt") if args.prompt is not None else None
    import torch

    from slmlab.generation import SamplingConfig, generate

    from ..models.quantize import apply_quantization
    from ..train.saved import load_for_inference

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_for_inference(args.run, args.device)
    ckpt, model, tokenizer, dev = loaded.checkpoint, loaded.model, loaded.tokenizer, loaded.device
    apply_quantization(model, args.quantize, dev)
    if prompt_ids is not None:
        ids = prompt_ids
    elif tokenizer is not None:
        ids = tokenizer(prompt or "", add_special_tokens=False)["input_ids"]
        if not ids and tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id]
    else:
        raise ValueError(f"{ckpt} has no tokenizer.json; pass --prompt-ids")
    if not ids:
        raise ValueError("the prompt is empty; give --prompt text or --prompt-ids")
    ids, n_new = fit_to_context(ids, args.max_new_tokens, model.max_positions(), args.truncate_prompt,
                                loaded.trained_context)
    input_ids = torch.tensor([ids], device=dev)
    new: list[int] = []
    printed = 0
    if tokenizer is not None and args.prompt_ids is None:
        print(args.prompt or "", end="", flush=True)

    def stream(token: torch.Tensor) -> None:
        nonlocal printed
        new.append(int(token[0]))
        if tokenizer is None or args.prompt_ids is not None:
            print(new[-1], end=" ", flush=True)
            return
        text = tokenizer.decode(new, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            print(text[printed:], end="", flush=True)
            printed = len(text)

    stops = [tokenizer.eos_token_id] if tokenizer is not None and tokenizer.eos_token_id is not None else []
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    generate(model, input_ids, n_new, SamplingConfig(args.temperature, args.top_k, args.top_p),
             stop_tokens=stops, callback=stream, generator=gen, compile=args.compile)
    print()
    return 0


def fit_to_context(ids: list[int], max_new_tokens: int, max_positions: int | None, truncate: bool,
                   trained_context: int | None = None) -> tuple[list[int], int]:
    """``(prompt ids, new tokens)`` that fit the model's context, never silently.

    A prompt that leaves no room for a new token is an error, unless ``truncate``: then its oldest
    tokens are dropped (keeping room for ``max_new_tokens``, at least one) with a warning. When the
    context caps ``max_new_tokens``, a note on stderr says so; so does one when prompt and new tokens
    run past ``trained_context`` (the sequence length the model was trained on, when recorded),
    where the model reads positions it never trained on.
    """
    if max_positions is None:
        ids, n_new = ids, max_new_tokens
    else:
        ids, n_new = _fit_positions(ids, max_new_tokens, max_positions, truncate)
    if trained_context is not None and len(ids) + n_new > trained_context:
        print(f"slmlab generate: note: {len(ids)} prompt + {n_new} new tokens run past the {trained_context}-token context"
              " the model was trained on; the tokens beyond it may be poor", file=sys.stderr)
    return ids, n_new


def _fit_positions(ids: list[int], max_new_tokens: int, max_positions: int, truncate: bool) -> tuple[list[int], int]:
    if len(ids) >= max_positions and max_new_tokens > 0:
        if not truncate:
            raise ValueError(
                f"the prompt has {len(ids)} tokens and fills the model's context of {max_positions} positions, so nothing"
                " can be generated; shorten the prompt or pass --truncate-prompt to keep only its last tokens"
            )
        keep = max(1, max_positions - max_new_tokens)
        print(f"slmlab generate: warning: prompt left-truncated from {len(ids)} to its last {keep} tokens"
              f" (context {max_positions})", file=sys.stderr)
        ids = ids[-keep:]
    room = max_positions - len(ids)
    if max_new_tokens > room:
        print(f"slmlab generate: note: --max-new-tokens {max_new_tokens} capped at {max(room, 0)} by the model's context"
              f" of {max_positions} positions (prompt: {len(ids)} tokens)", file=sys.stderr)
    return ids, max(0, min(max_new_tokens, room))
