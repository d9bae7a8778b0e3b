"""Per-feature LM heads tied to the structured embedding, and the pretraining objective.

Objective (the seed's): flat position ``p`` predicts token ``p + 1`` with head ``g = (p + 1) mod F``.
Head ``g`` is therefore only used at positions ``p = g - 1 + kF`` (``g = 0``: ``p = F - 1 + kF``,
the last field of transaction ``k`` predicting the time gap of ``k + 1``), so ``forward_targets``
takes the strided slice ``hidden[:, (g-1) mod F :: F]`` instead of running every head at every
position (``F`` times less work). The loss is the mean over features of each feature's mean
cross-entropy, so the 4,096-way merchant head does not dominate.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .embedding import StructuredEmbedding
from .schema import MASK, PAD


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

    def _logits(self, h: torch.Tensor, g: int) -> torch.Tensor:
        out = h @ self.head_weight(g).T
        if self.bias is not None:
            start = sum(self.embedding[0].vocab_sizes[:g])
            out = out + self.bias[start:start + self.embedding[0].vocab_sizes[g]]
        return out

    def forward(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Every head at every position: ``[B, S, D]`` -> ``F`` tensors ``[B, S, V_f]``."""
        return [self._logits(hidden, g) for g in range(self.num_features)]

    def forward_targets(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """Head ``g`` only at the positions that predict a feature-``g`` token: ``F`` tensors
        ``[B, n_g, V_g]`` with ``n_g = T`` for ``g >= 1`` and ``T - 1`` for ``g = 0``."""
        nf = self.num_features
        out = []
        for g in range(nf):
            h = hidden[:, (g - 1) % nf::nf]
            out.append(self._logits(h[:, :-1] if g == 0 else h, g))
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
            ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), tgt.reshape(-1).long(), reduction="none")
            ce = ce * valid.reshape(-1)
            count = valid.sum()
            if int(count):
                losses.append(ce.sum() / count)
            with torch.no_grad():
                correct = ((lg.argmax(-1) == tgt) & valid).sum()
            stats[names[g]] = (float(ce.detach().sum()), int(correct), int(count))
        loss = torch.stack(losses).mean() if losses else hidden.sum() * 0.0
        return loss, stats
