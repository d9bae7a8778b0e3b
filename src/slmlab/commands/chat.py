"""``slmlab chat``: a terminal conversation with a saved model, streamed token by token."""

from __future__ import annotations

from ._common import add_max_new_tokens_argument, command_parser, utf8_text

PROMPT = "you> "
REPLY = "model> "
HELP = "/reset clears the history, /system TEXT sets the system line (/system alone removes it), /quit ends"


def chat_command(argv: list[str]) -> int:
    """Chat with a saved model in the terminal: streamed replies, history kept within its context.

    RUN is a run folder (its newest checkpoint), a checkpoint, a fine-tune's adapter folder or a merged model.
    The conversation is rendered with the tokenizer's chat template (the same one `slmlab serve` uses for
    /v1/chat/completions; slmlab's plain "User: ...\\nAssistant:" layout when the tokenizer has none).
    When the history no longer fits the context the model was trained on (minus --max-new-tokens), the
    oldest turns are dropped, with a notice. Commands: /reset, /system TEXT, /quit (or Ctrl-D).
    Examples:
      slmlab chat runs/quickstart-lora
      slmlab chat runs/quickstart-lora --system "Answer briefly." --temperature 0 --max-new-tokens 64
    """
    p = command_parser(chat_command, "chat")
    p.add_argument("run")
    p.add_argument("--system", default=None, help="the system line of the conversation")
    add_max_new_tokens_argument(p, 128)
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (each reply continues the same generator)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch's default)")
    args = p.parse_args(argv)
    if args.max_new_tokens <= 0:
        raise ValueError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    if args.system is not None:
        utf8_text(args.system, "--system")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    import torch

    from ..generation import SamplingConfig
    from ..generation.chat import ChatSession
    from ..train.saved import load_for_inference

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_for_inference(args.run, args.device)
    if loaded.tokenizer is None:
        raise ValueError(f"{loaded.checkpoint} has no tokenizer; slmlab chat needs the tokenizer saved with the model")
    context = loaded.context()
    if args.max_new_tokens >= context:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} leaves no room for the conversation in the model's context of"
                         f" {context} tokens; lower it")
    session = ChatSession(loaded.model, loaded.tokenizer, loaded.device, context - args.max_new_tokens, args.max_new_tokens,
                          SamplingConfig(args.temperature, args.top_k, args.top_p),
                          torch.Generator(device=loaded.device).manual_seed(args.seed), args.system)
    print(f"slmlab chat: {loaded.checkpoint} ({loaded.family.name}, context {context} tokens, {session.template}); {HELP}")
    while True:
        try:
            line = input(PROMPT)
        except EOFError:
            print()
            return 0
        except UnicodeDecodeError as err:  # a terminal that is not UTF-8: this line is lost, the history is not
            print(f"(not sent: the line is not valid UTF-8 ({err.reason} at byte {err.start}); check the terminal's"
                  " encoding)")
            continue
        if not respond(session, line.strip()):
            return 0



def respond(session, line: str) -> bool:
    """Handle one input line of ``session`` (a command, or a message whose reply streams to stdout);
    False when the session ends."""
    if line in ("/quit", "/exit"):
        return False
    if line == "/reset":
        session.turns.clear()
        print("(history cleared)")
    elif line == "/system" or line.startswith("/system "):
        system = line[len("/system"):].strip() or None
        try:
            session.system = system if system is None else utf8_text(system, "the system line")
        except ValueError as err:
            print(f"(not set: {err})")
            return True
        print(f"(system line set: {session.system})" if session.system else "(system line removed)")
    elif line.startswith("/"):
        print(f"(unknown command {line.split()[0]}; {HELP})")
    elif line:
        try:
            reply = session.reply(utf8_text(line, "the message"))
        except ValueError as err:
            print(f"(not sent: {err})")
            return True
        if reply.dropped:
            print(f"(dropped the {reply.dropped} oldest message(s) to fit the model's context)")
        print(REPLY, end="", flush=True)
        for piece in reply:  # the reply as it is decoded
            print(piece, end="", flush=True)
        print(flush=True)
    return True
