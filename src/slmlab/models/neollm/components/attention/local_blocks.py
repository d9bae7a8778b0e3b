"""Blocked sliding-window attention for local IHA layers: the paper's FLOP argument made real.

With window ``W`` a query token ``t`` sees keys ``s`` with ``t − W < s ≤ t``. Cut the sequence into
blocks of ``C = W`` tokens: every query of block ``i`` finds all its keys inside blocks ``i − 1`` and
``i``. Attention then runs per block over ``C·P`` pseudo-queries and ``2C·P`` pseudo-keys, costing
``2·T·W·P²`` scores instead of ``T²·P²`` — a quarter with the automatic ``W = T/(2P²)`` at P = 2,
i.e. the ``O(H N² d / 2)`` of IHA local layers (Duvvuri et al., arXiv 2602.21371, section 5.1). The mask
(causal, window, padding, token-level over the P slots) is the same relative pattern in every block.
Exactly the same softmax as the full masked attention on every row that sees at least one key.
The score -> probability -> value step is the layer's attention function (``functions.py``), so
every entry of :data:`~.functions.ATTENTION_FUNCTIONS` runs on this path unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .....layers.masks import AttentionBias
from .functions import AttentionCall, AttentionFunction, softmax_attention


def blocked_local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None,
    window: int,
    dropout_p: float = 0.0,
    attend: AttentionFunction = softmax_attention,
    scale: float | None = None,
    affine=None,
) -> torch.Tensor:
    """Sliding-window attention of a fresh sequence (no cached keys), block by block.

    Args:
        q: ``[B, T, H, P, D]``; k, v: ``[B, T, H_kv, P, D]`` (the same ``T`` tokens).
        attention_mask: ``[B, T]`` (1 = real token) or None.
        window: ``W >= 1`` tokens.
        dropout_p: attention-probability dropout.
        attend: the attention function (an entry of ``ATTENTION_FUNCTIONS``).
        scale: score scale passed to ``attend`` (None: ``1/√`` of q's width).
        affine: :class:`~.affine.AffineTerms` (``alpha [B, T, H]``, ``mean [B, H_kv, T, D]``) or None;
            both are blocked like q.
    Returns:
        ``[B, T, H, P, D]``.
    """
    b, t, h, p, _ = q.shape
    hk = k.shape[2]
    c = window
    nb = -(-t // c)
    pad = nb * c - t
    qb = F.pad(q, (0, 0, 0, 0, 0, 0, 0, pad)).view(b, nb, c, h, p, q.shape[-1])
    qb = qb.permute(0, 1, 3, 2, 4, 5).reshape(b, nb, h, c * p, q.shape[-1])

    def key_blocks(x: torch.Tensor) -> torch.Tensor:  # [B, T, Hk, P, D] -> [B, nb, Hk, 2C·P, D]
        d = x.shape[-1]
        xb = F.pad(x, (0, 0, 0, 0, 0, 0, c, pad)).view(b, nb + 1, c, hk, p, d)
        xb = xb.permute(0, 1, 3, 2, 4, 5).reshape(b, nb + 1, hk, c * p, d)
        return torch.cat((xb[:, :-1], xb[:, 1:]), dim=3)

    valid = torch.ones(b, t, dtype=torch.bool, device=q.device) if attention_mask is None else attention_mask.bool()
    valid = F.pad(valid, (c, pad), value=False).view(b, nb + 1, c)
    valid = torch.cat((valid[:, :-1], valid[:, 1:]), dim=2)  # [B, nb, 2C]
    a = torch.arange(c, device=q.device)[:, None] + c  # query token, counted from the previous block's start
    s = torch.arange(2 * c, device=q.device)[None, :]
    allowed = ((s <= a) & (a - s < window))[None, None] & valid[:, :, None, :]  # [B, nb, C, 2C]
    allowed = allowed | ~allowed.any(-1, keepdim=True)  # rows of padding that see nothing: keep SDPA finite
    allowed = allowed.repeat_interleave(p, dim=-1).repeat_interleave(p, dim=-2)
    # Blocks folded into the batch: 4-D inputs keep SDPA on its fused kernels.
    alpha, alpha_ma, mean = None, None, None
    if affine is not None:  # α [B, T, H] -> [B·nb, H, C·P]; mean [B, Hk, T, D] -> [B·nb, Hk, C·P, D]
        alpha = F.pad(affine.alpha, (0, 0, 0, pad), value=1.0).view(b, nb, c, h).permute(0, 1, 3, 2)
        alpha, alpha_ma = alpha.repeat_interleave(p, dim=-1).reshape(b * nb, h, c * p), affine.alpha_ma
        dv = affine.mean.shape[-1]
        mean = F.pad(affine.mean, (0, 0, 0, pad)).view(b, hk, nb, c, dv).transpose(1, 2)
        mean = mean.repeat_interleave(p, dim=3).reshape(b * nb, hk, c * p, dv)
    bias = AttentionBias(allowed.reshape(b * nb, 1, c * p, 2 * c * p), False)
    call = AttentionCall(bias, dropout_p, scale, alpha, alpha_ma, mean)
    kb, vb = key_blocks(k), key_blocks(v)
    out = attend(
        qb.reshape(b * nb, h, c * p, q.shape[-1]),
        kb.reshape(b * nb, hk, 2 * c * p, k.shape[-1]),
        vb.reshape(b * nb, hk, 2 * c * p, v.shape[-1]),
        call,
    )
    d = v.shape[-1]
    out = out.view(b, nb, h, c, p, d).permute(0, 1, 3, 2, 4, 5).reshape(b, nb * c, h, p, d)
    return out[:, :t]
