"""Surprisal inputs for the fraud head: how unexpected each field of a transaction is to the pretrained LM.

Fraud is unusual for the customer (a new device, a far-away location, an odd merchant, amount or hour).
The pretrained per-feature heads already say how unusual: for field ``f`` of transaction ``t`` the
surprisal is the negative log-likelihood of the actual token given every earlier token,

    s[t, f] = -log p(ids[t, f] | ids[<t], ids[t, <f]),

read from the prediction at flat position ``t*F + f - 1`` through head ``f`` (for ``f = 0``, the time
gap, from the previous transaction's last position ``t*F - 1``). Only the fields before the score
field (``f < score_index``: everything but ``auth_method`` and ``response_code``) are used, so the
inputs never read the transaction's own response code or any later token. Where no prediction exists
(the first real row's time gap, padded rows, PAD / MASK targets) the surprisal is 0. Each field is
divided by ``log V_f`` (the surprisal of a uniform guess), a fixed, data-independent scale, so the
inputs are of order 1 and no statistics need fitting.

:class:`SurprisalFraudHead` feeds these ``score_index`` numbers (``inputs="surprisal"``), or them and
the score-position state (``inputs="both"``), to a small head: logistic (``inner=0``) or an MLP. The
surprisal needs no labels; with few labelled frauds a head with a dozen inputs has little room to
memorise them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..data.schema import MASK, PAD

HEAD_INPUTS = ("state", "surprisal", "both")


def field_surprisal(lm_heads, hidden: torch.Tensor, ids: torch.Tensor, txn_mask: torch.Tensor,
                    num_fields: int) -> torch.Tensor:
    """Surprisal (nats) of fields ``0 .. num_fields - 1`` of every transaction.

    Args:
        lm_heads: the encoder's :class:`~slmlab.transactions.embedding.PerFeatureLMHeads`.
        hidden: ``[B, T*F, D]`` backbone states.
        ids: ``[B, T, F]`` the window's ids.
        txn_mask: ``[B, T]`` real rows.
        num_fields: how many leading fields to score (the score index).
    Returns:
        ``[B, T, num_fields]`` float32, 0 where no prediction exists.
    """
    B, T, nf = ids.shape
    out = []
    for g in range(num_fields):
        if g == 0:  # the time gap of t, predicted from the last position of t - 1
            h = hidden[:, nf - 1::nf][:, :-1]
            tgt, valid = ids[:, 1:, 0], txn_mask[:, 1:] & txn_mask[:, :-1]
        else:
            h = hidden[:, g - 1::nf]
            tgt, valid = ids[:, :, g], txn_mask
        logp = F.log_softmax(lm_heads.logits(h, g).float(), -1)
        valid = valid & (tgt != PAD) & (tgt != MASK)
        nll = -logp.gather(-1, tgt.long().unsqueeze(-1)).squeeze(-1) * valid
        out.append(F.pad(nll, (1, 0)) if g == 0 else nll)
    return torch.stack(out, -1)


class SurprisalFraudHead(nn.Module):
    """Fraud logits from the field surprisals (and optionally the score-position state).

    Args:
        lm_heads: the encoder's per-feature heads (held by reference, not as a submodule, so their
            weights stay the encoder's).
        vocab_sizes: ``V_f`` of every feature (the scale ``log V_f``).
        hidden_size: ``D``; score_index: the score field (surprisal of fields ``< score_index``);
        num_features: ``F``.
        inputs: ``surprisal`` (``score_index`` numbers) or ``both`` (those and the ``D`` state).
        inner: MLP width; 0 gives a logistic head ``Linear(W, 1)``.
        dropout: after the SiLU of the MLP.
    """

    def __init__(self, lm_heads, vocab_sizes, hidden_size: int, score_index: int, num_features: int,
                 inputs: str = "surprisal", inner: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        if inputs not in ("surprisal", "both"):
            raise ValueError(f"fraud_head_inputs must be one of {HEAD_INPUTS}, got {inputs!r}")
        if inner < 0:
            raise ValueError(f"fraud_hidden must be >= 0 (0: logistic head), got {inner!r}")
        self.lm_heads = [lm_heads]
        self.score_index, self.num_features = score_index, num_features
        self.with_state = inputs == "both"
        self.scale = tuple(math.log(v) for v in vocab_sizes[:score_index])  # not a buffer: fixed by the schema
        width = score_index + (hidden_size if self.with_state else 0)
        self.mlp = (nn.Linear(width, 1) if inner == 0 else
                    nn.Sequential(nn.Linear(width, inner), nn.SiLU(), nn.Dropout(dropout), nn.Linear(inner, 1)))

    def features(self, hidden: torch.Tensor, ids: torch.Tensor, txn_mask: torch.Tensor) -> torch.Tensor:
        """``[B, T, W]``: the scaled surprisals, then (``both``) the score-position state."""
        s = field_surprisal(self.lm_heads[0], hidden, ids, txn_mask, self.score_index)
        s = s / torch.tensor(self.scale, dtype=s.dtype, device=s.device)
        if not self.with_state:
            return s
        return torch.cat([s.to(hidden.dtype), hidden[:, self.score_index::self.num_features]], -1)

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor | None = None,
                txn_mask: torch.Tensor | None = None, tabular: torch.Tensor | None = None) -> torch.Tensor:
        """``hidden [B, T*F, D]``, ``ids [B, T, F]``, ``txn_mask [B, T]`` -> logits ``[B, T]`` (``tabular``
        is not read)."""
        if ids is None:
            raise ValueError("the surprisal fraud head needs the window's ids; call it with (hidden, ids, txn_mask)")
        if txn_mask is None:
            txn_mask = (ids != PAD).any(-1)
        return self.mlp(self.features(hidden, ids, txn_mask).to(self.mlp_dtype)).squeeze(-1)

    @property
    def mlp_dtype(self) -> torch.dtype:
        return next(self.mlp.parameters()).dtype
