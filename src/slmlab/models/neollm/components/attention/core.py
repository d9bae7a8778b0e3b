"""Attention core of a NeoLLM layer (``docs/neollm-attention.md#attention-core``): the bookkeeping
around one attention function (cache append, token-level masks over the IHA pseudo-tokens, the
local window, the blocked local path); the score -> probability -> value step itself is an entry of
:data:`~.functions.ATTENTION_FUNCTIONS` chosen at construction.

Scores ``s_ij = q_i·k_j / √D``; query head ``h`` reads KV head ``h // G`` (GQA through
``enable_gqa``, no copies). Pseudo-tokens ``(t, p)`` sit at index ``t·P + p``; visibility is
token-level: ``(t, p)`` sees ``(s, p')`` iff token ``s`` is visible to token ``t`` (causal, padding,
and on local 'L' layers ``t − s < W``). One boolean mask carries all of it, so training with
``attention_dropout`` uses SDPA's own ``dropout_p``.

Local window ``W`` (``docs/neollm-attention.md#local-window``): an int ``iha_sliding_window`` wins;
otherwise the window stored in the layer state; otherwise ``max(1, L_b // (2P²))`` with ``L_b`` the real
(unpadded) tokens of row ``b`` in this call, which a cached call stores so that every later decoding step
reuses it. Taking ``L_b`` per row makes a left-padded row the same function as the row alone; rows
whose windows differ get one per-row window ``[B]`` (masked path), equal ones a single int.
``slmlab train`` writes the training window into the config
(``NeoLLMPreTrainedModel.prepare_for_training``), so a trained model never reaches the last rule; a
model that does logs one warning naming the frozen ``W``.

A local layer over a fresh sequence longer than ``2W`` runs block by block (``local_blocks.py``,
``2TWP²`` scores instead of ``T²P²``); decoding steps and chunks after a cache use the masked path
over the last ``T + W − 1`` cached tokens only (older keys are outside every query's window).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn

from .....layers.masks import AttentionBias, causal_bias
from .affine import visible_token_mean
from .functions import AttentionCall, AttentionFunction, softmax_attention
from .functions import from_config as attention_function_from_config
from .local_blocks import blocked_local_attention

logger = logging.getLogger(__name__)


def automatic_window(seq_len: int, pseudo_heads: int) -> int:
    """IHA's FLOP-matching window for a sequence of ``seq_len`` tokens: ``max(1, T // (2P²))``."""
    return max(1, int(seq_len) // (2 * pseudo_heads**2))


def row_windows(attention_mask: torch.Tensor | None, q_len: int, pseudo_heads: int) -> int | torch.Tensor:
    """The automatic window of each row from its real length: ``max(1, L_b // (2P²))``, ``L_b`` the
    row's real tokens among this call's ``q_len`` (all of them without a mask). One int when every
    row gets the same window, else a ``[B]`` long tensor."""
    if attention_mask is None:
        return automatic_window(q_len, pseudo_heads)
    real = attention_mask[:, -q_len:].sum(-1)
    w = torch.clamp(real // (2 * pseudo_heads**2), min=1).long()
    return int(w[0]) if bool((w == w[0]).all()) else w


def window_reach(window: int | torch.Tensor) -> int:
    """The widest window of ``window`` (an int, or one per row): how far back any query reads."""
    return int(window.max()) if isinstance(window, torch.Tensor) else int(window)


def within_window(distance: torch.Tensor, window: int | torch.Tensor) -> torch.Tensor:
    """``distance < W``: ``[T, S]`` token distances against an int window (``[T, S]``) or per-row
    windows ``[B]`` (``[B, T, S]``)."""
    if isinstance(window, torch.Tensor):
        return distance[None] < window.to(distance.device)[:, None, None]
    return distance < window


def training_window(config, seq_len: int) -> int | None:
    """The window the local layers of ``config`` use when trained on ``seq_len``-token sequences, or
    None when there is nothing to resolve (the config fixes the window, or no layer is local)."""
    if config.iha_sliding_window is not None:
        return None
    if not any(config.iha_kind(i) == "local" for i in range(config.num_hidden_layers)):
        return None
    return automatic_window(seq_len, config.iha_num_pseudo_heads)


class AttentionCore(nn.Module):
    """Args:
        pseudo_heads: ``P_eff`` of this layer (1 on non-IHA and "mix" layers).
        local: this is a local 'L' IHA layer (sliding window).
        window: ``iha_sliding_window`` (int) or None (automatic per row, frozen by the cache).
        dropout: ``attention_dropout`` on the probabilities, training only.
        attend: the attention function (an entry of ``ATTENTION_FUNCTIONS``).
        warn_on_freeze: log one warning the first time this core freezes an automatic window from a
            cache prefill (the model sets it on its first local layer only).
        scale: score scale (``1/√D`` of the content channels, so appended GOAT prior channels add
            their logit unscaled); None means ``1/√`` of q's width.
    Shapes:
        q ``[B, T, H, P, D']``, k ``[B, T, H_kv, P, D']``, v ``[B, T, H_kv, P, D]`` (``D' ≥ D`` with the
        GOAT prior), attention_mask ``[B, past + T]`` or None, affine: :class:`~.affine.AffineTerms` or
        None -> o ``[B, T, H, P, D]``.
    """

    def __init__(
        self,
        pseudo_heads: int,
        local: bool,
        window: int | None,
        dropout: float,
        attend: AttentionFunction = softmax_attention,
        warn_on_freeze: bool = False,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.pseudo_heads = pseudo_heads
        self.local = local
        self.window = window
        self.dropout = float(dropout)
        self.attend = attend
        self.warn_on_freeze = warn_on_freeze
        self.scale = scale

    @classmethod
    def from_config(cls, config, layer_idx: int) -> AttentionCore:
        """The core of layer ``layer_idx``: its ``P_eff``, whether it is local, the window, dropout
        and attention function."""
        kind = config.iha_kind(layer_idx)
        p = config.iha_num_pseudo_heads if kind in ("local", "global") else 1
        first_local = next((i for i in range(config.num_hidden_layers) if config.iha_kind(i) == "local"), None)
        return cls(
            p,
            kind == "local",
            config.iha_sliding_window,
            config.attention_dropout,
            attention_function_from_config(config, layer_idx),
            warn_on_freeze=layer_idx == first_local,
            scale=config.head_dim**-0.5,
        )

    def resolve_window(self, q_len: int, state, attention_mask: torch.Tensor | None = None) -> int | torch.Tensor | None:
        """The window ``W`` this call uses: an int, one per row (``[B]``, automatic windows of rows of
        different real lengths), or None on global layers."""
        if not self.local:
            return None
        if self.window is not None:
            return int(self.window)
        if state is not None and state.window is not None:
            return state.window
        w = row_windows(attention_mask, q_len, self.pseudo_heads)
        if state is not None:
            state.window = w
            self._warn_frozen(w, q_len)
        return w

    def _warn_frozen(self, window: int | torch.Tensor, q_len: int) -> None:
        if not self.warn_on_freeze:
            return
        self.warn_on_freeze = False
        logger.warning(
            "NeoLLM: iha_sliding_window is None, so the local IHA layers froze their window to W=%s from this "
            "%d-token prefill (max(1, T // (2P^2)) of each row's real tokens); a model trained on longer sequences used a larger window, "
            "so this decode is a different function. Fix: set config.iha_sliding_window to the training window "
            "(slmlab train writes it; or call model.prepare_for_training(seq_len) before saving).",
            window.tolist() if isinstance(window, torch.Tensor) else window,
            q_len,
        )

    def bias(self, attention_mask, q_len: int, kv_len: int, window: int | torch.Tensor | None, device) -> AttentionBias:
        """Token-level causal/window/padding bias, expanded to the interleaved pseudo-tokens; a
        per-row window ``[B]`` gives each row its own band."""
        per_row = isinstance(window, torch.Tensor)
        bias = causal_bias(attention_mask, q_len, kv_len, device, sliding_window=None if per_row else window)
        p = self.pseudo_heads
        if p == 1 and not per_row:
            return bias
        mask = bias.mask
        q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        k_pos = torch.arange(kv_len, device=device)[None, :]
        if mask is None:  # plain causal (or one query seeing everything): make it explicit
            mask = (k_pos <= q_pos)[None, None]
        if per_row:
            mask = mask & within_window(q_pos - k_pos, window)[:, None]
        mask = mask.repeat_interleave(p, dim=-1).repeat_interleave(p, dim=-2)
        return AttentionBias(mask, False)

    def forward(self, q, k, v, attention_mask=None, state=None, affine=None, weights=None):
        """``weights``: the forward's attention-weight list (``output_attentions``); the call then takes
        the masked path over every cached key and the attention function's eager path, and appends
        ``[B, H, T·P, S·P]`` (pseudo-token rows and columns, ``S`` = cached + new tokens)."""
        b, t, h, p, _ = q.shape
        d = v.shape[-1]
        fresh = state is None or state.length == 0
        window = self.resolve_window(t, state, attention_mask)
        dropout = self.dropout if self.training else 0.0
        if window is not None and not isinstance(window, torch.Tensor) and fresh and t > 2 * window and weights is None:
            if state is not None:  # prefill: the cache still gets every key/value
                state.update(*(x.permute(0, 2, 1, 3, 4).reshape(b, x.shape[2], t * p, x.shape[-1]) for x in (k, v)))
            mask = None if attention_mask is None else attention_mask[:, -t:]
            if affine is not None:  # the visible mean per query token, by prefix sums over the fresh sequence
                mean = visible_token_mean(v.permute(0, 2, 1, 3, 4), None if mask is None else mask.bool(), t, window)
                affine = replace(affine, mean=mean)
            return blocked_local_attention(q, k, v, mask, window, dropout, self.attend, self.scale, affine)
        qs = q.permute(0, 2, 1, 3, 4).reshape(b, h, t * p, q.shape[-1])
        ks = k.permute(0, 2, 1, 3, 4).reshape(b, k.shape[2], t * p, k.shape[-1])
        vs = v.permute(0, 2, 1, 3, 4).reshape(b, v.shape[2], t * p, d)
        if state is not None:
            ks, vs = state.update(ks, vs)
        if attention_mask is not None and attention_mask.shape[-1] < ks.shape[2] // p:
            raise ValueError(
                f"attention_mask covers {attention_mask.shape[-1]} tokens but the layer holds {ks.shape[2] // p} "
                "(cached + new); pass the full 2-D mask over past and current tokens"
            )
        kv_len = ks.shape[2] // p
        if window is not None and weights is None and kv_len > t + window_reach(window) - 1:  # older than every query's window
            kv_len = t + window_reach(window) - 1
            ks, vs = ks[:, :, -kv_len * p :], vs[:, :, -kv_len * p :]
        alpha, alpha_ma, mean = None, None, None
        if affine is not None:  # one α per pseudo-query row [B, H, T·P]; the visible mean by prefix sums
            alpha, alpha_ma = affine.alpha.transpose(1, 2).repeat_interleave(p, dim=-1), affine.alpha_ma
            valid = None if attention_mask is None else attention_mask[:, -kv_len:].bool()
            tokens = vs.view(b, vs.shape[1], kv_len, p, d)
            mean = visible_token_mean(tokens, valid, t, window).repeat_interleave(p, dim=2)
        bias = self.bias(attention_mask, t, kv_len, window, q.device)
        bias.weights = weights
        call = AttentionCall(bias, dropout, self.scale, alpha, alpha_ma, mean)
        out = self.attend(qs, ks, vs, call)
        return out.view(b, h, t, p, d).permute(0, 2, 1, 3, 4)
