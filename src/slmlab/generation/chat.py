"""A chat session: a conversation with a model, its history kept within the context, each reply streamed.

The conversation is rendered with the tokenizer's chat template (:mod:`slmlab.data.chat`; slmlab's
plain ``User: ...\\nAssistant:`` layout when it has none), the oldest turns dropped when the history
no longer fits. A reply is decoded by a :class:`~slmlab.generation.Decoder` and ends at the model's
end-of-text token, at ``max_tokens``, or where the model starts the next user turn (:data:`TURN_STOP`,
never part of the reply). ``slmlab chat`` reads lines and prints what a session returns; the server's
``/v1/chat/completions`` uses the same template and turn stop (:func:`chat_stops`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..data.chat import chat_template, fit_history
from .decoder import Decoder
from .loop import weights_frozen
from .sampling import SamplingConfig
from .text import TextStream

TURN_STOP = "\nUser:"


def chat_stops(stop: list[str]) -> list[str]:
    """The request's stop strings plus the start of a new user turn."""
    return list(stop) + ([TURN_STOP] if TURN_STOP not in stop else [])


class ChatSession:
    """One conversation: the history, the system line, and one streamed reply per message.

    Args:
        model / tokenizer / device: the loaded model (:func:`slmlab.train.saved.load_for_inference`).
        budget: the most prompt tokens (the context minus ``max_tokens``).
        max_tokens: the longest reply.
        sampling / generator: how tokens are drawn (each reply continues the same generator).
        system: the system line (None: none).
    Attributes:
        turns: the history, ``[{"role", "content"}]`` (the system line apart).
    """

    def __init__(self, model, tokenizer, device, budget: int, max_tokens: int, sampling: SamplingConfig,
                 generator: torch.Generator | None, system: str | None = None) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.budget, self.max_tokens = budget, max_tokens
        self.sampling, self.generator = sampling, generator
        self.system = system
        self.turns: list[dict] = []

    @property
    def template(self) -> str:
        """Which chat template renders the conversation: ``"its own chat template"`` (the tokenizer's)
        or ``"slmlab's plain template"``."""
        own = chat_template(self.tokenizer) == self.tokenizer.chat_template
        return "its own chat template" if own else "slmlab's plain template"

    def reply(self, text: str) -> Reply:
        """Add the user's ``text`` and fit the history into the budget; the returned :class:`Reply`
        streams the answer when iterated.

        Raises:
            ValueError: the message cannot be sent (it does not fit the context even alone); the
                history is unchanged.
        """
        self.turns.append({"role": "user", "content": text})
        try:
            ids, dropped = fit_history(self.tokenizer, self.system, self.turns, self.budget)
        except ValueError:
            self.turns.pop()
            raise
        return Reply(self, ids, dropped)


class Reply:
    """One answer of a :class:`ChatSession`, streamed: iterating yields the text as it is decoded
    (what a terminal may show: the template's space after ``Assistant:`` and a trailing line break
    wait for more text); when the iteration ends, :attr:`text` is the answer and the session's
    history holds it.

    Attributes:
        dropped: how many of the oldest messages were dropped to fit the context.
        text: the whole answer (stripped), once the iteration has ended.
    """

    def __init__(self, session: ChatSession, ids: list[int], dropped: int) -> None:
        self.session, self.ids, self.dropped = session, ids, dropped
        self.text: str | None = None

    def __iter__(self) -> Iterator[str]:
        session = self.session
        stream = TextStream(session.tokenizer, chat_stops([]))
        eos = session.tokenizer.eos_token_id
        decoder = Decoder(session.model, session.sampling, generator=session.generator,
                          stop_tokens=[eos] if eos is not None else [])
        shown = 0
        with weights_frozen():
            decoder.prefill(torch.tensor([self.ids], device=session.device), max_new_tokens=session.max_tokens)
            while not (decoder.done or stream.stopped):
                stream.push(int(decoder.step()[0]))
                piece, shown = _visible(stream, shown)
                if piece:
                    yield piece
        stream.flush()
        piece, shown = _visible(stream, shown)
        if piece:
            yield piece
        self.text = stream.text.strip()
        session.turns.append({"role": "assistant", "content": self.text})


def _visible(stream: TextStream, shown: int) -> tuple[str, int]:
    """The text released so far that was not shown yet, and the new length shown."""
    text = stream.text[:stream.sent].lstrip(" ").rstrip()
    return (text[shown:], len(text)) if len(text) > shown else ("", shown)
