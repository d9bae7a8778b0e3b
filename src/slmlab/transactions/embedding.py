"""StructuredEmbedding: a ``[B, T, F]`` grid of per-feature ids -> a ``[B, T*F, D]`` token sequence.

``e[b, t, f] = table_f(ids[b, t, f]) + feature_emb[f] + txn_index_emb[t]``, flattened
transaction-major (token ``p = t*F + f``). The ``F`` tables live in one concatenated
``nn.Embedding(sum V_f, D)`` with row offsets, so ``table_weight(f)`` is a view of it (the LM heads
tie to it). Why two position signals: RoPE in the attention layers sees the flat position, but the
short convolutions are position-agnostic, so ``feature_emb`` tells every layer which field a token is
and ``txn_index_emb`` which row. Padded transactions are multiplied by the mask: exactly zero.
"""

from __future__ import annotations

import torch
from torch import nn


class StructuredEmbedding(nn.Module):
    """Args:
        vocab_sizes: ``V_f`` per feature (specials included).
        names: feature names (for errors).
        hidden_size: ``D``.
        max_transactions: rows of ``txn_index_emb`` (the largest ``T``).
        init_std: normal init std; row 0 (PAD) of every table is then zeroed.
    """

    def __init__(self, vocab_sizes: list[int], names: list[str], hidden_size: int, max_transactions: int = 64,
                 init_std: float = 0.02) -> None:
        super().__init__()
        self.vocab_sizes = [int(v) for v in vocab_sizes]
        self.names = list(names)
        self.num_features = len(self.vocab_sizes)
        self.max_transactions = int(max_transactions)
        self.offset_list = [sum(self.vocab_sizes[:f]) for f in range(self.num_features)]
        self.tables = nn.Embedding(sum(self.vocab_sizes), hidden_size)
        self.feature_emb = nn.Embedding(self.num_features, hidden_size)
        self.txn_index_emb = nn.Embedding(self.max_transactions, hidden_size)
        self.init_std = init_std
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for emb in (self.tables, self.feature_emb, self.txn_index_emb):
            emb.weight.normal_(0.0, self.init_std)
        self.zero_pad_rows()

    @torch.no_grad()
    def zero_pad_rows(self) -> None:
        """Re-zero row 0 (PAD) of every feature table."""
        self.tables.weight[self.offset_list] = 0.0

    def table_weight(self, f: int) -> torch.Tensor:
        """Feature ``f``'s table ``[V_f, D]``: a view sharing storage with the parameter."""
        start = sum(self.vocab_sizes[:f])
        return self.tables.weight[start:start + self.vocab_sizes[f]]

    def check_ids(self, ids: torch.Tensor) -> None:
        if ids.dim() != 3 or ids.shape[-1] != self.num_features:
            raise ValueError(f"ids must be [B, T, F={self.num_features}], got {tuple(ids.shape)}")
        if ids.shape[1] > self.max_transactions:
            raise ValueError(f"T={ids.shape[1]} exceeds max_transactions={self.max_transactions}; use shorter windows")
        if ids.dtype.is_floating_point:
            raise ValueError(f"ids must be integers, got {ids.dtype}")
        limits = torch.tensor(self.vocab_sizes, device=ids.device)
        bad = (ids.amax(dim=(0, 1)) >= limits) | (ids.amin(dim=(0, 1)) < 0)
        if bool(bad.any()):
            f = int(bad.nonzero()[0, 0])
            raise ValueError(f"ids of feature {self.names[f]!r} must lie in [0, {self.vocab_sizes[f]}),"
                             f" got {int(ids[..., f].min())}..{int(ids[..., f].max())}")

    def forward(self, ids: torch.Tensor, txn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Args:
            ids: ``[B, T, F]`` integer ids.
            txn_mask: ``[B, T]`` (True = real); default: any id != PAD.
        Returns:
            ``[B, T*F, D]``.
        """
        self.check_ids(ids)
        B, T, F = ids.shape
        if txn_mask is None:
            txn_mask = (ids != 0).any(-1)
        offsets = torch.tensor(self.offset_list, device=ids.device, dtype=ids.dtype)
        e = self.tables(ids + offsets) + self.feature_emb.weight + self.txn_index_emb.weight[:T, None, :]
        e = e * txn_mask[..., None, None].to(e.dtype)
        return e.reshape(B, T * F, -1)
