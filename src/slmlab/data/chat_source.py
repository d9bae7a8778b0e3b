"""The chat data source: conversations as padded rows scored only on the assistant's tokens.

:class:`ChatSource` is a :class:`~slmlab.data.sources.DataSource` like the corpora and tasks, so the
trainer, its exact resume and the evaluation read it unchanged. Each conversation is one row
(:func:`slmlab.data.chat.encode_conversation`: the template's ids and the end-of-text token); a batch
is right-padded to its longest row with the pad token, ``attention_mask`` 0 on the padding, and
``labels`` = the ids on the assistant's tokens and -100 everywhere else (system and user turns, role
tags, padding), so the loss and the validation figures are the assistant-token loss. Every tenth
conversation (index 9, 19, ...) is held out as the validation split.
"""

from __future__ import annotations

import numpy as np
import torch

from .chat import encode_conversation
from .chat_data import load_chat
from .sources import DataSource
from .tasks import IGNORE_INDEX

VALIDATION_EVERY = 10


class ChatSource(DataSource):
    """Conversations tokenized once, served as padded batches.

    Attributes:
        seq_len: ``block_size``, the context the fine-tune trains (recorded as the checkpoint's trained context).
        rows: per split, ``(ids, scored)`` arrays of each conversation.
    Args:
        name: the data spec (``builtin:chat`` or a ``.jsonl`` path).
        conversations: the message lists (:func:`slmlab.data.chat_data.load_chat`).
        tokenizer: renders them through its chat template (the default one when it has none).
        block_size: the longest row; longer conversations are cut to it (a row cut before its first
            assistant token is dropped); both counts are in :attr:`notes`.
    Raises:
        ValueError: fewer than two conversations, or none fits ``block_size``.
    """

    is_synthetic = False
    splits = ("train", "validation")

    def __init__(self, name: str, conversations: list[list[dict]], tokenizer, block_size: int) -> None:
        if not isinstance(block_size, int) or block_size < 2:
            raise ValueError(f"block_size must be an integer >= 2, got {block_size!r}")
        if len(conversations) < 2:
            raise ValueError(f"{name} holds {len(conversations)} conversation(s); a fine-tune needs at least 2 (every"
                             f" {VALIDATION_EVERY}th is held out for validation, and at least one)")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; chat batches are padded: set tokenizer.pad_token")
        self.name = name
        self.tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        held_out = {i for i in range(len(conversations)) if i % VALIDATION_EVERY == VALIDATION_EVERY - 1}
        held_out = held_out or {len(conversations) - 1}
        self.rows: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"train": [], "validation": []}
        cut = dropped = 0
        warned = getattr(tokenizer, "deprecation_warnings", {})  # rows longer than the model are cut below, not an error
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
        for i, messages in enumerate(conversations):
            ids, scored = encode_conversation(tokenizer, messages)
            if len(ids) > block_size:
                cut += 1
                ids, scored = ids[:block_size], scored[:block_size]
                if not any(scored[1:]):
                    dropped += 1
                    continue
            split = "validation" if i in held_out else "train"
            self.rows[split].append((np.asarray(ids, dtype=np.int64), np.asarray(scored, dtype=bool)))
        for split, rows in self.rows.items():
            if not rows:
                raise ValueError(f"{name}: no {split} conversation fits block_size={block_size}; raise block_size")
        self.seq_len = block_size  # the context it trains (a batch is padded only to its longest row)
        self.min_vocab_size = max(len(tokenizer), 1 + max(int(ids.max()) for rows in self.rows.values() for ids, _ in rows))
        self.notes = []
        if cut:
            self.notes.append(f"{cut} conversation(s) longer than block_size={block_size} tokens were cut to it"
                              f" ({dropped} dropped: nothing of the assistant's left); raise block_size to keep them whole")

    @classmethod
    def from_spec(cls, spec: str, tokenizer, block_size: int) -> ChatSource:
        """A source from a chat data spec (:func:`slmlab.data.chat_data.load_chat`)."""
        return cls(spec, load_chat(spec), tokenizer, block_size)

    def train_texts(self):
        """No documents for BPE training: a fine-tune keeps its model's tokenizer."""
        return iter(())

    def bytes_per_token(self, split: str) -> float | None:
        """None: chat figures are per assistant token (bits per byte would mix in the unscored prompt)."""
        return None

    def scored_tokens(self, split: str) -> int:
        """How many tokens of ``split`` are scored (the assistant's, and each row's end-of-text)."""
        return int(sum(scored[1:].sum() for _, scored in self.rows[split]))

    def _num_rows(self, split: str, shuffled: bool) -> int:
        return len(self.rows[split])

    def _rows(self, split, epochs, rows, sampler, shuffled) -> dict[str, torch.Tensor]:
        picked = [self.rows[split][int(r)] for r in rows]
        t = max(len(ids) for ids, _ in picked)
        input_ids = torch.full((len(picked), t), self.pad_id, dtype=torch.long)
        labels = torch.full((len(picked), t), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(picked), t), dtype=torch.long)
        for i, (ids, scored) in enumerate(picked):
            row = torch.from_numpy(ids)
            input_ids[i, : len(ids)] = row
            labels[i, : len(ids)] = torch.where(torch.from_numpy(scored), row, IGNORE_INDEX)
            mask[i, : len(ids)] = 1
        labels[:, 0] = IGNORE_INDEX  # nothing predicts the first token
        return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}

