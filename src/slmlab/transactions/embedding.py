"""The encoder's input and output over tokens: :class:`StructuredEmbedding` (a ``[B, T, F]`` grid of
per-feature ids -> a ``[B, T*F, D]`` token sequence) and :class:`PerFeatureLMHeads` (the pretraining
objective's heads, tied to the embedding's tables).

StructuredEmbedding:

``e[b, t, f] = table_f(ids[b, t, f]) + feature_emb[f] + txn_index_emb[t]``, flattened
transaction-major (token ``p = t*F + f``). The ``F`` tables live in one concatenated
``nn.Embedding(sum V_f, D)`` with row offsets, so ``table_weight(f)`` is a view of it (the LM heads
tie to it). Why two position signals: RoPE in the attention layers sees the flat position, but the
short convolutions are position-agnostic, so ``feature_emb`` tells every layer which field a token is
and ``txn_index_emb`` which row. Padded transactions are multiplied by the mask: exactly zero.

PerFeatureLMHeads (the seed's objective): flat position ``p`` predicts token ``p + 1`` with head
``g = (p + 1) mod F``. Head ``g`` is therefore only used at positions ``p = g - 1 + kF`` (``g = 0``:
``p = F - 1 + kF``, the last field of transaction ``k`` predicting the time gap of ``k + 1``), so
``forward_targets`` takes the strided slice ``hidden[:, (g-1) mod F :: F]`` instead of running every
head at every position (``F`` times less work). The loss is the mean over features of each feature's
mean cross-entropy, so the 4,096-way merchant head does not dominate.
"""

from __future__ import annotations

import torch
from torch import nn

from .data.schema import MASK, PAD


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


class PerFeatureLMHeads(nn.Module):
    """Args:
        embedding: the :class:`StructuredEmbedding` whose tables the heads reuse (tied weights).
        bias: add a per-feature output bias (``sum V_f`` extra parameters).
    """

    def __init__(self, embedding: StructuredEmbedding, bias: bool = False) -> None:
        super().__init__()
        self.embedding = [embedding]  # a list: not a submodule, so its parameters are not counted twice
        self.num_features = embedding.num_features
        self.bias = nn.Parameter(torch.zeros(sum(embedding.vocab_sizes))) if bias else None

    def head_weight(self, g: int) -> torch.Tensor:
        return self.embedding[0].table_weight(g)

    def logits(self, h: torch.Tensor, g: int) -> torch.Tensor:
        """Head ``g`` on states ``h [..., D]`` -> ``[..., V_g]``."""
        out = h @ self.head_weight(g).T
        if self.bias is not None:
            start = sum(self.embedding[0].vocab_sizes[:g])
            out = out + self.bias[start:start + self.embedding[0].vocab_sizes[g]]
        return out

    def forward(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Every head at every position: ``[B, S, D]`` -> ``F`` tensors ``[B, S, V_f]``."""
        return [self.logits(hidden, g) for g in range(self.num_features)]

    def forward_targets(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Head ``g`` only at the positions that predict a feature-``g`` token: ``F`` tensors
        ``[B, n_g, V_g]`` with ``n_g = T`` for ``g >= 1`` and ``T - 1`` for ``g = 0``."""
        nf = self.num_features
        out = []
        for g in range(nf):
            h = hidden[:, (g - 1) % nf::nf]
            out.append(self.logits(h[:, :-1] if g == 0 else h, g))
        return out

    def lm_loss(self, hidden: torch.Tensor, ids: torch.Tensor, txn_mask: torch.Tensor | None = None,
                names: list[str] | None = None) -> tuple[torch.Tensor, dict]:
        """Feature-balanced next-token loss.

        Args:
            hidden: ``[B, T*F, D]`` backbone states.
            ids: ``[B, T, F]`` the input ids (targets are the next tokens).
            txn_mask: ``[B, T]``; targets in padded rows, or predicted from a padded row, are ignored,
                as are PAD and MASK targets.
        Returns:
            ``(loss, per_feature)`` with ``per_feature[name] = (ce_sum, correct, count)`` (sums, so
            they add over batches).
        """
        if txn_mask is None:
            txn_mask = (ids != PAD).any(-1)
        names = names or [str(g) for g in range(self.num_features)]
        logits = self.forward_targets(hidden)
        losses, stats = [], {}
        for g, lg in enumerate(logits):
            if g == 0:
                tgt, valid = ids[:, 1:, 0], txn_mask[:, 1:] & txn_mask[:, :-1]
            else:
                tgt, valid = ids[:, :, g], txn_mask
            valid = valid & (tgt != PAD) & (tgt != MASK)
            ce = nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), tgt.reshape(-1).long(), reduction="none")
            ce = ce * valid.reshape(-1)
            count = valid.sum()
            if int(count):
                losses.append(ce.sum() / count)
            with torch.no_grad():
                correct = ((lg.argmax(-1) == tgt) & valid).sum()
            stats[names[g]] = (float(ce.detach().sum()), int(correct), int(count))
        loss = torch.stack(losses).mean() if losses else hidden.sum() * 0.0
        return loss, stats
