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

    from ..generation import SamplingConfig, generate
    from ..generation.context import encode_prompt, fit_to_context
    from ..models.quantize import apply_quantization
    from ..train.saved import load_for_inference

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_for_inference(args.run, args.device)
    ckpt, model, tokenizer, dev = loaded.checkpoint, loaded.model, loaded.tokenizer, loaded.device
    apply_quantization(model, args.quantize, dev)
    if prompt_ids is None and tokenizer is None:
        raise ValueError(f"{ckpt} has no tokenizer.json; pass --prompt-ids")
    ids = prompt_ids if prompt_ids is not None else encode_prompt(tokenizer, prompt or "")
    if not ids:
        raise ValueError("the prompt is empty; give --prompt text or --prompt-ids")
    fitted = fit_to_context(ids, args.max_new_tokens, model.max_positions(), args.truncate_prompt, loaded.trained_context)
    for note in fitted.notes:
        print(f"slmlab generate: {note}", file=sys.stderr)
    as_text = tokenizer is not None and args.prompt_ids is None
    if as_text:
        print(args.prompt or "", end="", flush=True)
    new, printed = [], 0

    def stream(token: torch.Tensor) -> None:
        nonlocal printed
        new.append(int(token[0]))
        if not as_text:
            print(new[-1], end=" ", flush=True)
        elif not (text := tokenizer.decode(new, skip_special_tokens=True)).endswith("\ufffd"):  # a whole character
            print(text[printed:], end="", flush=True)
            printed = len(text)

    stops = [tokenizer.eos_token_id] if tokenizer is not None and tokenizer.eos_token_id is not None else []
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    generate(model, torch.tensor([fitted.ids], device=dev), fitted.new_tokens, SamplingConfig(args.temperature, args.top_k, args.top_p),
             stop_tokens=stops, callback=stream, generator=gen, compile=args.compile)
    print()
    return 0

