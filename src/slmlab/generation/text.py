"""Incremental detokenization with stop strings: new token ids in, safe text deltas out.

A token may end in the middle of a multi-byte character, and the text so far may end with the
beginning of a stop string; neither may be sent yet. :class:`TextStream` holds such a tail back
until it is resolved, so the concatenated deltas of a stream equal the final text exactly.
"""

from __future__ import annotations


class TextStream:
    """The text of one completion, grown one token at a time.

    Args:
        tokenizer: decodes the generated ids (``skip_special_tokens=True``, as ``slmlab generate``).
        stop: strings that end the completion; the text is cut before the first one found.
    """

    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one token; returns the text that is now safe to send (possibly ``""``). After a stop
        string appears, :attr:`stopped` is True and the text ends before it."""
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[:cut], True
            return self.flush()
        self.text = text
        safe = len(text)
        if text.endswith("\ufffd"):  # the rest of a multi-byte character is still to come
            safe = len(text.rstrip("\ufffd"))
        hold = 0  # hold back a tail that may be the start of a stop string
        for s in self.stop:
            hold = max([hold] + [k for k in range(1, min(len(s) - 1, safe) + 1) if text[safe - k:safe] == s[:k]])
        safe = max(safe - hold, self.sent)
        delta, self.sent = text[self.sent:safe], safe
        return delta

    def flush(self) -> str:
        """The rest of the text (at the end of the completion)."""
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta
