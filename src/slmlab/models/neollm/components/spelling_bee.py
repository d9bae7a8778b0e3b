"""Spelling Bee embeddings (Rabe, Clymo & Dong, "Spelling Bee Embeddings for Language Modeling",
arXiv 2601.18030), docs/neollm.md#spelling-bee.

``e(t) = ½ (e_tok(t) + n_t^{-1/2} Σ_{i=1..n_t} RoPE(E_byte[b_{t,i}], i))`` with ``b_{t,i}`` the UTF-8
bytes of token ``t`` (at most 16), ``n_t`` their count and ``E_byte`` a shared ``256 × D`` table.
The intra-token RoPE is full-width, rotate-half, ``θ_j = 10000^{-2j/D}`` (not ``rope_theta``), byte
position ``i`` 1-based (our decision). Ids with ``n_t = 0`` (specials, ids the tokenizer lacks) keep
``e_tok(t)`` unchanged, without halving (our decision).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ....layers.rotary import rotate_half
from .byte_table import tokenizer_bytes

MAX_TOKEN_BYTES = 16
BYTE_ROPE_BASE = 10000.0


class SpellingBee(nn.Module):
    """Byte-level augmentation of token embeddings.

    The byte table (``byte_ids [V, 16]`` uint8, ``byte_len [V]`` uint8, ``table_ready``) lives in
    persistent buffers, so a saved model needs no tokenizer to load; forward raises
    ``RuntimeError`` until :meth:`set_byte_table` (or :meth:`set_byte_table_from_bytes`) was called.

    Args:
        vocab_size: ``V``.
        hidden_size: ``D`` (even, for the rotation).
    Shapes:
        e_tok ``[B, T, D]``, ids ``[B, T]`` -> ``[B, T, D]``.
    """

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"Spelling Bee rotates byte embeddings: hidden_size must be even, got {hidden_size}")
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.byte_embed = nn.Embedding(256, hidden_size)
        self.register_buffer("byte_ids", torch.zeros(vocab_size, MAX_TOKEN_BYTES, dtype=torch.uint8))
        self.register_buffer("byte_len", torch.zeros(vocab_size, dtype=torch.uint8))
        self.register_buffer("table_ready", torch.zeros((), dtype=torch.bool))
        self.table_version = 0  # bumped whenever the table changes (invalidates baked tables)
        self._ready = False

    @classmethod
    def from_config(cls, config, layer_idx: int | None = None) -> nn.Module:
        """Spelling Bee when ``use_spelling_bee_embeddings``, else :class:`NoSpellingBee` (``layer_idx`` unused)."""
        if not config.use_spelling_bee_embeddings:
            return NoSpellingBee()
        return cls(config.vocab_size, config.hidden_size)

    def reset_parameters_with(self, init_module) -> None:
        """The empty, not-ready byte table (``_init_weights``): a model built on the meta device and
        materialised gets the buffers of a fresh one, never leftover memory. ``byte_embed`` is an
        ``nn.Embedding`` and gets the shared init. ``init_module`` is ``transformers.initialization``
        (which leaves buffers that ``from_pretrained`` loaded as they are) or ``torch.nn.init``."""
        for buf in (self.byte_ids, self.byte_len, self.table_ready):
            init_module.zeros_(buf)
        self.table_version += 1  # baked tables are stale; readiness is read from the buffer again
        self._ready = False

    # -- the byte table ----------------------------------------------------------------------
    def set_byte_table(self, tokenizer) -> None:
        """Fill the byte table from a transformers tokenizer (rules in :mod:`.byte_table`)."""
        self.set_byte_table_from_bytes(tokenizer_bytes(tokenizer, self.vocab_size))

    @torch.no_grad()
    def set_byte_table_from_bytes(self, token_bytes: Sequence[bytes]) -> None:
        """Fill the byte table from one ``bytes`` per id (shorter lists leave the rest empty).

        Args:
            token_bytes: ``token_bytes[t]`` is the UTF-8 encoding of token ``t``; truncated to 16.
        """
        if len(token_bytes) > self.vocab_size:
            raise ValueError(f"got {len(token_bytes)} byte strings for a vocabulary of {self.vocab_size}")
        ids = torch.zeros(self.vocab_size, MAX_TOKEN_BYTES, dtype=torch.uint8)
        lens = torch.zeros(self.vocab_size, dtype=torch.uint8)
        for t, raw in enumerate(token_bytes):
            if not isinstance(raw, (bytes, bytearray)):
                raise TypeError(f"token_bytes[{t}] must be bytes, got {type(raw).__name__}")
            raw = bytes(raw[:MAX_TOKEN_BYTES])
            if raw:
                ids[t, : len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
                lens[t] = len(raw)
        device = self.byte_embed.weight.device
        self.byte_ids = ids.to(device)
        self.byte_len = lens.to(device)
        self.table_ready = torch.ones((), dtype=torch.bool, device=device)
        self.table_version += 1
        self._ready = True

    def _check_ready(self) -> None:
        if not self._ready and not torch.compiler.is_compiling():  # reads a buffer's value: eager only
            self._ready = bool(self.table_ready)
            if not self._ready:
                raise RuntimeError(
                    "Spelling Bee embeddings need the token byte table: call "
                    "model.model.spelling_bee.set_byte_table(tokenizer) once after building the model "
                    "(or build it with use_spelling_bee_embeddings=False)"
                )

    def _load_from_state_dict(self, *args, **kwargs):
        self._ready = False
        self.table_version += 1
        return super()._load_from_state_dict(*args, **kwargs)

    # -- maths -------------------------------------------------------------------------------
    def byte_rotation(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[16, D]`` for byte positions 1..16 (computed on use; no buffer)."""
        half = torch.arange(0, self.hidden_size, 2, device=device, dtype=torch.float32) / self.hidden_size
        inv_freq = BYTE_ROPE_BASE**-half
        ang = torch.outer(torch.arange(1, MAX_TOKEN_BYTES + 1, device=device, dtype=torch.float32), inv_freq)
        ang = torch.cat((ang, ang), dim=-1)
        return ang.cos().to(dtype), ang.sin().to(dtype)

    def spell(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The byte term ``n^{-1/2} Σ_i RoPE(E_byte[b_i], i)`` and ``n`` for every id in ``ids [N]``.

        Returns:
            spelled ``[N, D]`` (zero where ``n = 0``) and lengths ``[N]`` (int64).
        """
        self._check_ready()
        lengths = self.byte_len[ids].long()
        emb = self.byte_embed(self.byte_ids[ids].long())  # [N, 16, D]
        cos, sin = self.byte_rotation(emb.device, emb.dtype)
        rotated = emb * cos + rotate_half(emb) * sin
        keep = torch.arange(MAX_TOKEN_BYTES, device=ids.device)[None, :] < lengths[:, None]
        total = (rotated * keep[..., None].to(emb.dtype)).sum(1)
        return total * lengths.clamp(min=1).to(emb.dtype).rsqrt()[:, None], lengths

    def forward(self, e_tok: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if torch.compiler.is_compiling():  # torch.unique's size depends on the values: spell every id
            unique, inverse = flat, torch.arange(flat.numel(), device=flat.device)
        else:
            unique, inverse = torch.unique(flat, return_inverse=True)
        spelled, lengths = self.spell(unique)
        mixed = torch.where((lengths > 0)[:, None], 0.5 * spelled, torch.zeros_like(spelled))
        half = torch.where(lengths > 0, 0.5, 1.0).to(e_tok.dtype)
        scale = half[inverse].view(*ids.shape, 1)
        return e_tok * scale + mixed[inverse].view(*ids.shape, -1).to(e_tok.dtype)


class NoSpellingBee(nn.Module):
    """The "off" switch (``use_spelling_bee_embeddings=False``): returns the token embedding."""

    def forward(self, e_tok: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return e_tok

    def set_byte_table(self, tokenizer) -> None:
        raise ValueError("this model was built with use_spelling_bee_embeddings=False; it has no byte table to set")

    set_byte_table_from_bytes = set_byte_table
