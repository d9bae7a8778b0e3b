"""``slmlab chat``: a terminal conversation with a saved model, streamed token by token."""

from __future__ import annotations

import sys

from ._common import add_max_new_tokens_argument, command_parser, utf8_text

PROMPT = "you> "
REPLY = "model> "
HELP = "/reset clears the history, /system TEXT sets the system line (/system alone removes it), /quit ends"


class TurnEnded(Exception):
    """Raised from the streaming callback when the reply reached a stop string."""


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

    from ..data.chat import chat_template
    from ..generation import SamplingConfig
    from ..train.saved import load_for_inference

    if args.threads:
        torch.set_num_threads(args.threads)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    loaded = load_for_inference(args.run, args.device)
    if loaded.tokenizer is None:
        raise ValueError(f"{loaded.checkpoint} has no tokenizer; slmlab chat needs the tokenizer saved with the model")
    context = loaded.context()
    if args.max_new_tokens >= context:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} leaves no room for the conversation in the model's context of"
                         f" {context} tokens; lower it")
    own = "its own chat template" if chat_template(loaded.tokenizer) == loaded.tokenizer.chat_template else "slmlab's plain template"
    print(f"slmlab chat: {loaded.checkpoint} ({loaded.family.name}, context {context} tokens, {own}); {HELP}")
    session = ChatSession(loaded.model, loaded.tokenizer, loaded.device, context - args.max_new_tokens, args.max_new_tokens,
                          sampling, torch.Generator(device=loaded.device).manual_seed(args.seed), args.system)
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
        if not session.command(line.strip()):
            return 0


class ChatSession:
    """One terminal conversation: the history, the system line, and streaming one reply.

    Args:
        model / tokenizer / device: the loaded model (:func:`slmlab.train.saved.load_for_inference`).
        budget: the most prompt tokens (the context minus ``max_tokens``).
        max_tokens: the longest reply.
        sampling / generator: how tokens are drawn.
        system: the system line (None: none).
    """

    def __init__(self, model, tokenizer, device, budget: int, max_tokens: int, sampling, generator, system=None):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.budget, self.max_tokens = budget, max_tokens
        self.sampling, self.generator = sampling, generator
        self.system = system
        self.turns: list[dict] = []

    def command(self, line: str) -> bool:
        """Handle one input line (a command or a user message); False when the session ends."""
        if line in ("/quit", "/exit"):
            return False
        if line == "/reset":
            self.turns.clear()
            print("(history cleared)")
        elif line == "/system" or line.startswith("/system "):
            system = line[len("/system"):].strip() or None
            try:
                self.system = system if system is None else utf8_text(system, "the system line")
            except ValueError as err:
                print(f"(not set: {err})")
                return True
            print(f"(system line set: {self.system})" if self.system else "(system line removed)")
        elif line.startswith("/"):
            print(f"(unknown command {line.split()[0]}; {HELP})")
        elif line:
            self.reply(line)
        return True

    def reply(self, text: str) -> str:
        """Answer ``text``: stream the reply to stdout, keep both turns in the history; returns the reply
        ("" when it was not sent: text that is not UTF-8, or a message that does not fit)."""
        import torch

        from ..data.chat import fit_history
        from ..generation import generate
        from ..serve.chat import chat_stops
        from ..generation.text import TextStream

        try:
            utf8_text(text, "the message")
        except ValueError as err:
            print(f"(not sent: {err})")
            return ""
        self.turns.append({"role": "user", "content": text})
        try:
            ids, dropped = fit_history(self.tokenizer, self.system, self.turns, self.budget)
        except ValueError as err:
            self.turns.pop()
            print(f"(not sent: {err})")
            return ""
        if dropped:
            print(f"(dropped the {dropped} oldest message(s) to fit the model's context)")
        stream = TextStream(self.tokenizer, chat_stops([]))
        printed = 0

        def show(token: torch.Tensor | None) -> None:
            nonlocal printed
            if token is not None:
                stream.push(int(token[0]))
            # the template puts one space after "Assistant:"; a trailing newline waits for more text
            text = stream.text[:stream.sent].lstrip(" ").rstrip()
            if len(text) > printed:
                print(text[printed:], end="", flush=True)
                printed = len(text)
            if stream.stopped:
                raise TurnEnded

        eos = self.tokenizer.eos_token_id
        print(REPLY, end="", flush=True)
        try:
            generate(self.model, torch.tensor([ids], device=self.device), self.max_tokens, self.sampling,
                     generator=self.generator, stop_tokens=[eos] if eos is not None else [], callback=show)
        except TurnEnded:
            pass
        stream.flush()
        try:
            show(None)
        except TurnEnded:
            pass
        print(flush=True)
        answer = stream.text.strip()
        self.turns.append({"role": "assistant", "content": answer})
        sys.stdout.flush()
        return answer
