"""Token id -> UTF-8 bytes, for Spelling Bee embeddings (docs/neollm.md#spelling-bee; rules in docs/neollm.md#decisions).

For each id below the model's vocabulary size the first matching rule gives its bytes:
1. the id is beyond the tokenizer (``id >= len(tokenizer)``) or a special / added control token:
   no bytes (the embedding is then the plain token embedding);
2. a SentencePiece byte-fallback piece ``<0xHH>``: the single byte ``HH``;
3. a byte-level BPE piece (every character in the GPT-2 byte<->unicode map): mapped back to bytes;
4. otherwise the piece string with ``▁`` read as a space, encoded as UTF-8.
"""

from __future__ import annotations

import re

from slmlab.data.byte_alphabet import unicode_to_byte

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def piece_to_bytes(piece: str) -> bytes:
    """Rules 2-4 for one vocabulary piece."""
    fallback = _BYTE_FALLBACK.match(piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    table = unicode_to_byte()
    if piece and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return piece.replace("▁", " ").encode("utf-8")


def tokenizer_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """The byte string of every id ``< vocab_size`` (``b""`` for rule 1).

    Args:
        tokenizer: a transformers tokenizer (``convert_ids_to_tokens``, ``all_special_ids``,
            ``added_tokens_decoder``, ``len``).
        vocab_size: the model's vocabulary size ``V``.
    """
    known = min(len(tokenizer), vocab_size)
    control = set(getattr(tokenizer, "all_special_ids", []) or [])
    for idx, token in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(token, "special", False):
            control.add(int(idx))
    pieces = tokenizer.convert_ids_to_tokens(list(range(known)))
    out = []
    for idx in range(vocab_size):
        if idx >= known or idx in control or pieces[idx] is None:
            out.append(b"")
        else:
            out.append(piece_to_bytes(pieces[idx]))
    return out
