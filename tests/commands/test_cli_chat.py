"""`slmlab chat`: a scripted conversation through a pseudo-terminal, streaming, history and its commands."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest
import torch

from serve_helpers import build_checkpoint
from slmlab.commands.chat import PROMPT, REPLY
from slmlab.data.chat import prompt_ids
from slmlab.generation import SamplingConfig, generate
from slmlab.generation.chat import ChatSession
from slmlab.train.saved import load_for_inference

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Lumen with the byte tokenizer and a 96-token context (greedy replies: printable text)."""
    return build_checkpoint("lumen", tmp_path_factory.mktemp("chat") / "ckpt", max_seq_len=96)


def greedy_reply(loaded, messages: list[dict]) -> str:
    ids = torch.tensor([prompt_ids(loaded.tokenizer, messages)])
    out = generate(loaded.model, ids, MAX_TOKENS, SamplingConfig(0.0), stop_tokens=[loaded.tokenizer.eos_token_id])
    return loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


class Terminal:
    """``slmlab chat`` on a pseudo-terminal: send lines, read until a marker appears."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "slmlab.cli", "chat", *args], stdin=slave, stdout=slave,
                                     stderr=slave, close_fds=True)
        os.close(slave)
        self.seen = ""

    def read_until(self, marker: str, timeout: float = 120.0) -> str:
        """Everything printed until ``marker`` (consumed), as the terminal shows it."""
        end = time.monotonic() + timeout
        while marker not in self.seen:
            assert time.monotonic() < end, f"no {marker!r} in {self.seen[-500:]!r}"
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if ready:
                try:
                    self.seen += os.read(self.master, 4096).decode("utf-8", "replace").replace("\r\n", "\n")
                except OSError:  # the child closed the terminal
                    break
        before, _, self.seen = self.seen.partition(marker)
        return before

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            os.close(self.master)


def test_chat_through_a_terminal(checkpoint):
    loaded = load_for_inference(checkpoint, "cpu")
    term = Terminal(str(checkpoint), "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--device", "cpu")
    try:
        banner = term.read_until(PROMPT)
        assert "context 96 tokens" in banner and "slmlab's plain template" in banner and "/reset" in banner
        history: list[dict] = []
        questions = ["What is 2 + 2?", "Name a colour.", "And another one?"]
        for question in questions:
            term.send(question)
            shown = term.read_until(PROMPT)
            history.append({"role": "user", "content": question})
            dropped = "(dropped the 2 oldest message(s)" in shown
            if dropped:  # the context is 96 tokens minus 6 for the reply: the oldest turn goes, with a notice
                history = history[2:]
            want = greedy_reply(loaded, history)
            assert shown.split(REPLY, 1)[1].strip() == want  # the streamed reply is the model's greedy answer
            history.append({"role": "assistant", "content": want})
        assert dropped  # three turns of this length overflow the context
        term.send("/system Be terse.")
        assert "(system line set: Be terse.)" in term.read_until(PROMPT)
        term.send("/reset")
        assert "(history cleared)" in term.read_until(PROMPT)
        term.send("Hello?")  # after /reset: only the system line and this turn
        shown = term.read_until(PROMPT)
        want = greedy_reply(loaded, [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello?"}])
        assert shown.split(REPLY, 1)[1].strip() == want and "dropped" not in shown
        term.send("/frobnicate")
        assert "unknown command /frobnicate" in term.read_until(PROMPT)
        term.send("/quit")
    finally:
        status = term.close()
    assert status == 0


def test_replies_stream_token_by_token(checkpoint):
    loaded = load_for_inference(checkpoint, "cpu")
    session = ChatSession(loaded.model, loaded.tokenizer, loaded.device, 96 - MAX_TOKENS, MAX_TOKENS, SamplingConfig(0.0),
                          torch.Generator().manual_seed(0))
    reply = session.reply("What is 2 + 2?")
    pieces = [p for p in reply if p not in ("", "\n")]
    answer = reply.text
    assert answer == greedy_reply(loaded, [{"role": "user", "content": "What is 2 + 2?"}])
    assert len(pieces) > 1 and "".join(pieces) == answer  # one piece per decoded token, not the answer at the end
    assert session.turns == [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": answer}]


def test_chat_argument_errors_are_one_line(checkpoint, capsys):
    from slmlab import cli

    assert cli.main(["chat", str(checkpoint), "--max-tokens", "96"]) == 2
    assert "leaves no room for the conversation in the model's context of 96 tokens" in capsys.readouterr().err
    assert cli.main(["chat", str(checkpoint), "--max-tokens", "0"]) == 2
