"""Attention functions: the score -> probability -> value computation, one entry per variant.

:class:`~.core.AttentionCore` does the bookkeeping (cache append, window, masks, the blocked local
path) and then calls one function chosen once at construction, the way transformers selects an
attention interface. Every entry takes the same arguments, so a softmax variant is one entry in
:data:`ATTENTION_FUNCTIONS`, usable unchanged by the masked path (decoding, chunks after a cache,
global layers) and by the blocked local path (fresh sequences on 'L' layers). (LUCID and the GOAT
prior need no entry: they change V and the q/k channels before the kernel.)

Entries (``docs/neollm-attention.md#attention-core``):

* ``"softmax"``: ``o_i = Σ_j p_ij v_j``, ``p_ij = softmax_j(q_i·k_j·scale)`` over the keys the mask
  allows, dropout on ``p`` while training (fused SDPA).
* ``"affine"`` / ``"affine_eager"``: affine-scaled attention (Bae et al., arXiv 2602.23057;
  ``affine.py``), ``o_i = Σ_j [α_i p_ij + β_i] v_j`` at visible keys with ``β_i = (α_ma − α_i)/N_i``.
  ``"affine"`` uses the exact identity ``α_i·SDPA_i + (α_ma − α_i)·mean_{j visible} v_j`` (the masked
  mean from the core's prefix sums over tokens, ``call.mean``; without it from the mask); ``"affine_eager"``
  materialises ``p`` (dropout before the affine term). The affine term runs in fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .....layers.attention import sdpa
from .....layers.masks import AttentionBias


@dataclass(frozen=True)
class AttentionCall:
    """The per-call values every attention function receives (built once per core call).

    Args:
        bias: which keys each query may read (boolean mask ``[B | 1, 1, N_q, N_k]``, or
            ``is_causal`` with no mask).
        dropout: dropout probability on the attention probabilities (0 outside training).
        scale: score scale; None means ``1/√D`` of q (the GOAT prior passes ``1/√D`` of the content).
        alpha: affine-scaled attention's ``α`` per query row ``[B, H, N_q]`` (fp32), None without it.
        alpha_ma: the ``α_ma [H]`` of this call (with ``alpha``).
        mean: the mean visible value per query row ``[B, H_kv, N_q, D]`` (fp32), computed by the core
            from prefix sums; None lets ``"affine"`` derive it from the mask.
    """

    bias: AttentionBias
    dropout: float = 0.0
    scale: float | None = None
    alpha: torch.Tensor | None = None
    alpha_ma: torch.Tensor | None = None
    mean: torch.Tensor | None = None


AttentionFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionCall], torch.Tensor]


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """Scaled dot-product softmax attention through ``F.scaled_dot_product_attention``.

    Args:
        q: ``[B, H, N_q, D]``; k, v: ``[B, H_kv, N_k, D]`` (query head ``h`` reads KV head ``h // G``).
        call: mask, dropout and scale of this call.
    Returns:
        ``[B, H, N_q, D]``.
    """
    return sdpa(q, k, v, call.bias, call.dropout, call.scale)


def visible_mean(v: torch.Tensor, bias: AttentionBias, n_q: int, groups: int) -> torch.Tensor:
    """Mean of the values each query may read, fp32.

    Args:
        v: ``[B, H_kv, N_k, D]``; bias: the call's mask; n_q: queries (the last ``n_q`` of the keys
        under ``is_causal``); groups: ``G = H / H_kv``.
    Returns:
        ``[B, H, N_q, D]``. A plain causal pattern costs ``O(N·D)`` (prefix sums); an explicit mask one
        product ``mask @ V``.
    """
    vf = v.float()
    n_k = v.shape[2]
    if bias.mask is not None:
        m = bias.mask.to(torch.float32)  # [B | 1, 1, N_q, N_k]
        mean = (m @ vf) / m.sum(-1, keepdim=True).clamp(min=1.0)
    elif bias.is_causal:
        counts = torch.arange(n_k - n_q + 1, n_k + 1, device=v.device, dtype=torch.float32)[:, None]
        mean = vf.cumsum(2)[:, :, n_k - n_q :] / counts
    else:
        mean = vf.mean(2, keepdim=True).expand(-1, -1, n_q, -1)
    return mean.repeat_interleave(groups, dim=1) if groups > 1 else mean


def affine_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """Affine-scaled attention by the exact identity ``α·SDPA + (α_ma − α)·visible mean`` (shapes as
    :func:`softmax_attention`; ``call.alpha`` and ``call.alpha_ma`` required). When the forward asks for
    attention weights it runs :func:`affine_attention_eager`, which materialises them."""
    if call.bias.weights is not None:
        return affine_attention_eager(q, k, v, call)
    out = sdpa(q, k, v, call.bias, call.dropout, call.scale)
    with torch.autocast(q.device.type, enabled=False):
        alpha = call.alpha[..., None]
        shift = call.alpha_ma[None, :, None, None] - alpha
        g = q.shape[1] // k.shape[1]
        mean = visible_mean(v, call.bias, q.shape[2], g) if call.mean is None else call.mean.repeat_interleave(g, dim=1)
        return (alpha * out.float() + shift * mean).to(out.dtype)


def affine_attention_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """The eager reference of affine-scaled attention: ``(α·dropout(softmax(s)) + β·visible) @ V``."""
    with torch.autocast(q.device.type, enabled=False):
        g = q.shape[1] // k.shape[1]
        kf, vf = k.float().repeat_interleave(g, dim=1), v.float().repeat_interleave(g, dim=1)
        scale = call.scale if call.scale is not None else q.shape[-1] ** -0.5
        scores = q.float() @ kf.transpose(-1, -2) * scale
        n_q, n_k = scores.shape[-2:]
        if call.bias.mask is not None:
            visible = call.bias.mask.expand(scores.shape[0], 1, n_q, n_k)
        elif call.bias.is_causal:
            visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)[None, None]
        else:
            visible = torch.ones(1, 1, n_q, n_k, dtype=torch.bool, device=q.device)
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        probs = torch.nn.functional.dropout(probs, call.dropout, training=call.dropout > 0)
        alpha = call.alpha[..., None]
        beta = (call.alpha_ma[None, :, None, None] - alpha) / visible.sum(-1, keepdim=True).clamp(min=1)
        weights = alpha * probs + beta * visible
        if call.bias.weights is not None:  # output_attentions: the weights that multiply V
            call.bias.weights.append(weights.to(q.dtype))
        return (weights @ vf).to(v.dtype)


# Entry name -> function; `from_config` picks one per layer.
ATTENTION_FUNCTIONS: dict[str, AttentionFunction] = {
    "softmax": softmax_attention,
    "affine": affine_attention,
    "affine_eager": affine_attention_eager,
}


def from_config(config, layer_idx: int) -> AttentionFunction:
    """The attention function of layer ``layer_idx``: affine-scaled with ``use_affine_scaled_attention``
    (the eager entry when the model was loaded with ``attn_implementation="eager"``), else softmax."""
    if not config.use_affine_scaled_attention:
        return ATTENTION_FUNCTIONS["softmax"]
    eager = getattr(config, "_attn_implementation", None) == "eager"
    return ATTENTION_FUNCTIONS["affine_eager" if eager else "affine"]


__all__ = [
    "ATTENTION_FUNCTIONS",
    "AttentionCall",
    "AttentionFunction",
    "affine_attention",
    "affine_attention_eager",
    "from_config",
    "softmax_attention",
    "visible_mean",
]
