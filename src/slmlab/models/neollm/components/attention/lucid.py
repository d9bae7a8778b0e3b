"""LUCID preconditioning (Duvvuri, Patel, Gupta, Dhillon, "LUCID: Attention with Preconditioned
Representations", arXiv 2602.10410), ``docs/neollm-attention.md#lucid``.

Values are preconditioned by the inverse of a unit lower-triangular key-similarity matrix before the
kernel, ``V′ = L⁻¹ V``; attention then reads ``V′``. Per KV head and per IHA pseudo-slot ``p``
(independently, over the tokens' slot-``p`` keys and values):

* ``k̂_s = k̃_s / sqrt(mean_D(k̃_s²) + ε)``, with ``k̃_s`` the content channels of the final key (after
  rotation and shear; GOAT prior channels excluded);
* ``L_ts = exp(k̂_t·k̂_s/√D − √D)`` when key ``s`` is strictly earlier than ``t`` and visible to it under
  this layer's mask (causal, local window, padding), ``L_tt = 1``, else 0. RMS-normalised keys give
  ``k̂·k̂ = D``, so dividing ``exp(K̂K̂ᵀ/√D)`` by its constant diagonal ``e^{√D}`` (our decision) leaves
  off-diagonal entries in ``(e^{−2√D}, 1]``: ``V′ ≈ V`` for decorrelated keys and the triangular
  solve is always well posed. Pad keys get identity rows (``v′ = v``) and never enter other rows.

``V′`` is causal (forward substitution ``v′_t = v_t − Σ_{s<t} L_ts v′_s``), so the cache stores ``V′``
and a chunk of new tokens after a cache solves only its own block:
``V′_new = L_nn⁻¹ (V_new − L_np V′_past)``, ``k̂`` recomputed from the cached keys (only the last
``W − 1`` cached tokens on a local layer). Computed in fp32 (also under autocast), no parameters.
Memory ``O(B·H_kv·P·T·S)`` for ``T`` new of ``S`` visible tokens (``O(B·H_kv·P·S²)`` for a prefill):
``L`` is materialised, the attention kernel itself stays fused.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .core import window_reach, within_window


def lucid_matrix(k_rows, k_cols, visible, eps: float) -> torch.Tensor:
    """Off-diagonal ``L`` entries ``exp(k̂_t·k̂_s/√D − √D)`` where ``visible``, else 0.

    Args:
        k_rows: ``[..., T, D]``; k_cols: ``[..., S, D]`` content keys; visible: bool broadcastable to
        ``[..., T, S]`` (strictly earlier and allowed by the mask).
    """
    d = k_rows.shape[-1]
    norm = lambda k: k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps)  # noqa: E731
    scores = norm(k_rows) @ norm(k_cols).transpose(-1, -2) / math.sqrt(d) - math.sqrt(d)
    return torch.where(visible, scores.exp(), torch.zeros_like(scores))


class LucidPreconditioner(nn.Module):
    """Args:
        eps: ``lucid_attention_eps``.
    Shapes:
        k ``[B, T, H_kv, P, D']`` (final keys; the first ``D`` channels are content), v ``[B, T, H_kv, P, D]``,
        attention_mask ``[B, past + T]`` or None, window ``W`` (an int, one per row ``[B]``, or None),
        state: the layer's :class:`NeoLLMAttentionState` (read only: its cached keys and ``V′``)
        -> ``V′ [B, T, H_kv, P, D]``.
    """

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = float(eps)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """LUCID when ``use_lucid_attention``, else :class:`NoLucid`."""
        return cls(config.lucid_attention_eps) if config.use_lucid_attention else NoLucid()

    def forward(self, k, v, attention_mask=None, window=None, state=None):
        b, t, hk, p, d = v.shape
        with torch.autocast(v.device.type, enabled=False):
            kn = k[..., :d].float().permute(0, 2, 3, 1, 4)  # [B, Hk, P, T, D]
            vn = v.float().permute(0, 2, 3, 1, 4)
            past = 0 if state is None or state.keys is None else state.num_tokens
            keep = past if window is None else min(past, window_reach(window) - 1)
            if keep:
                ck = state.keys[:, :, (past - keep) * p : past * p].view(b, hk, keep, p, -1)[..., :d]
                cv = state.values[:, :, (past - keep) * p : past * p].view(b, hk, keep, p, d)
                kp, vp = ck.float().permute(0, 1, 3, 2, 4), cv.float().permute(0, 1, 3, 2, 4)
                cols = torch.cat((kp, kn), dim=3)
            else:
                cols, vp = kn, None
            s = keep + t
            qi = torch.arange(keep, s, device=v.device)[:, None]
            kj = torch.arange(s, device=v.device)[None, :]
            vis = kj < qi
            if window is not None:
                vis = vis & within_window(qi - kj, window)
            if attention_mask is not None:
                valid = attention_mask[:, -s:].bool()
                vis = vis & valid[:, None, :] & valid[:, keep:, None]
                vis = vis[:, None, None]  # [B, 1, 1, T, S]
            lower = lucid_matrix(kn, cols, vis, self.eps)  # [B, Hk, P, T, S]
            rhs = vn if vp is None else vn - lower[..., :keep] @ vp
            out = torch.linalg.solve_triangular(lower[..., keep:], rhs, upper=False, unitriangular=True)
        return out.permute(0, 3, 1, 2, 4).to(v.dtype)


class NoLucid(nn.Module):
    """The "off" switch: values pass through."""

    def forward(self, k, v, attention_mask=None, window=None, state=None):
        return v


__all__ = ["LucidPreconditioner", "NoLucid", "lucid_matrix"]
