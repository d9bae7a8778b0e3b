"""The 256-symbol byte <-> unicode alphabet of byte-level BPE (GPT-2; Radford et al. 2019).

Byte-level BPE works on strings, not bytes, so each byte is written as one printable character:
printable Latin-1 bytes (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``; 188 of them) stand for themselves,
and the other 68 bytes (controls, space, DEL, NBSP, soft hyphen) are shifted to code points 256, 257,
... in byte order, so that no byte becomes whitespace or a control character. This is the alphabet of
``tokenizers``' ``ByteLevel`` pre-tokenizer; :mod:`slmlab.data.tokenizers` builds its tokenizers on it
and NeoLLM's Spelling Bee byte table reads BPE pieces back to bytes with its inverse. This module is
the one copy in the library.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

_PRINTABLE = frozenset([*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)])


@lru_cache(maxsize=1)
def byte_to_unicode() -> Mapping[int, str]:
    """Byte ``0..255`` -> its one-character stand-in (read-only; built once)."""
    table, shifted = {}, 0
    for b in range(256):
        if b in _PRINTABLE:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return MappingProxyType(table)


@lru_cache(maxsize=1)
def unicode_to_byte() -> Mapping[str, int]:
    """The inverse of :func:`byte_to_unicode`: stand-in character -> byte (read-only; built once)."""
    return MappingProxyType({ch: b for b, ch in byte_to_unicode().items()})
