"""Attention Residuals, AttnRes (Kimi Team, "Attention Residuals", arXiv 2603.15031), as a residual
flow: the fixed residual sum is replaced by softmax attention over depth at each position.

Depth aggregation over sources ``S = [v_0 .. v_{n-1}]`` (each ``[B, T, D]``), in fp32::

    α = softmax_i(⟨w, RMSNorm_γ(v_i)⟩),   Agg(S) = Σ_i α_i v_i

with a pseudo-query ``w ∈ R^D`` initialised to 0 (uniform weights, the mean of the sources) and a
key-norm weight ``γ`` initialised to 1. Bookkeeping over decoder layers (``docs/neollm-residual.md#attnres``):
the completed sources start as ``[e]``; a partial sum ``P`` accumulates the sublayer updates of the
current block. With ``N = attn_res_num_blocks``: ``N = 0`` makes every layer its own block (full
AttnRes, ``L + 1`` sources at the read-out); otherwise blocks of ``max(1, L // N)`` layers, the last
block taking the remainder and ``N > L`` acting as ``N = L``. Per layer ``l``::

    if a block starts at l > 0: S.append(P); P = None
    u = RMSNorm_a(Agg_a(S + [P]));  P = a (block start) or P + a      # a = the attention update
    u = RMSNorm_m(Agg_m(S + [P]));  P = P + m
    read-out: RMSNorm_f(Agg_f(S + [P]))

``state.sources`` holds ``S`` and ``state.streams`` holds ``(P,)`` (empty before a block's first
update). Parameters: ``4·D`` per layer for the two ``(w, γ)`` pairs (besides the two pre-norms'
``2·D``) and ``2·D`` at the read-out (besides the final norm). Position-wise (depth only): no state across time.
"""

from __future__ import annotations

import torch
from torch import nn

from ....layers.norm import RMSNorm
from .context import ResidualState


def block_of(layer_idx: int, num_layers: int, num_blocks: int) -> int:
    """The block of decoder layer ``l``: ``l`` when ``N = 0``, else ``min(l // max(1, L // N), N − 1)``
    with ``N`` capped at ``L``."""
    if num_blocks == 0:
        return layer_idx
    n = min(num_blocks, num_layers)
    return min(layer_idx // max(1, num_layers // n), n - 1)


def starts_block(layer_idx: int, num_layers: int, num_blocks: int) -> bool:
    """Whether layer ``l`` opens a block (always at ``l = 0``)."""
    return layer_idx == 0 or block_of(layer_idx, num_layers, num_blocks) != block_of(layer_idx - 1, num_layers, num_blocks)


class DepthAttention(nn.Module):
    """``Agg(S) = Σ_i softmax_i(⟨w, RMSNorm_γ(v_i)⟩) v_i`` in fp32; ``w`` init 0, ``γ`` init 1 (2·D
    parameters).

    Args:
        dim: ``D``; eps: the key RMSNorm epsilon.
    Shapes:
        sources: a sequence of ``n`` tensors ``[B, T, D]`` -> ``[B, T, D]`` (dtype of the sources).
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.query = nn.Parameter(torch.zeros(dim, dtype=torch.float32))
        self.key_weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def reset_parameters_with(self, init_module) -> None:
        init_module.zeros_(self.query)
        init_module.ones_(self.key_weight)

    def weights(self, v: torch.Tensor) -> torch.Tensor:
        """Softmax weights ``[n, B, T]`` over stacked fp32 sources ``v [n, B, T, D]``.

        ``⟨w, γ ⊙ v / rms(v)⟩ = ⟨w ⊙ γ, v⟩ / rms(v)``: the normalised keys are never materialised
        (one mat-vec and one mean square per source; 2-2.5x faster than normalising, fwd + bwd).
        """
        q = self.query.float() * self.key_weight.float()
        return ((v @ q) * torch.rsqrt(v.pow(2).mean(-1) + self.eps)).softmax(0)

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        v = torch.stack(sources)
        alpha = self.weights(v.float())
        return (alpha.unsqueeze(-1) * v.float()).sum(0).to(v.dtype)


def _start(p: tuple[torch.Tensor, ...], update: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (update,)


def _accumulate(p: tuple[torch.Tensor, ...], update: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (p[0] + update,)


def _close_block(state: ResidualState) -> None:
    state.sources.append(state.streams[0])
    state.streams = ()


def _keep_block(state: ResidualState) -> None:
    pass


class AttnResResidual(nn.Module):
    """AttnRes for decoder layer ``l``: depth aggregation before each sublayer's pre-norm and the
    block partial sum as the update rule (``6·D`` parameters: two aggregators, two pre-norms).

    Args:
        dim: ``D``; layer_idx: ``l``; num_layers: ``L``; num_blocks: ``N`` (``attn_res_num_blocks``).
        eps: RMSNorm epsilon; input_norm: ``use_embedding_input_norm`` (False: no attention pre-norm at
            ``l = 0``, which then reads the raw embedding, the only source).
    Shapes:
        state.sources: ``[B, T, D]`` tensors; state.streams ``(P,)`` or ``()``.
    """

    junction = 0  # GPAS gates P after each add

    def __init__(self, dim: int, layer_idx: int, num_layers: int, num_blocks: int, eps: float = 1e-6,
                 input_norm: bool = True) -> None:
        super().__init__()
        opens = starts_block(layer_idx, num_layers, num_blocks)
        self.attn_agg = DepthAttention(dim, eps)
        self.mlp_agg = DepthAttention(dim, eps)
        self.attn_norm = nn.Identity() if (layer_idx == 0 and not input_norm) else RMSNorm(dim, eps)
        self.mlp_norm = RMSNorm(dim, eps)
        self._open = _close_block if (opens and layer_idx > 0) else _keep_block
        self._combine = (_start if opens else _accumulate, _accumulate)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> AttnResResidual:
        return cls(config.hidden_size, layer_idx, config.num_hidden_layers, config.attn_res_num_blocks,
                   config.rms_norm_eps, config.use_embedding_input_norm)

    def attn_input(self, state: ResidualState) -> torch.Tensor:
        self._open(state)
        state.sublayer = 0
        return self.attn_norm(self.attn_agg([*state.sources, *state.streams]))

    def mlp_input(self, state: ResidualState) -> torch.Tensor:
        state.sublayer = 1
        state.mlp_stream = self.mlp_agg([*state.sources, *state.streams])  # h_m
        return self.mlp_norm(state.mlp_stream)

    def add(self, state: ResidualState, update: torch.Tensor) -> None:
        state.streams = self._combine[state.sublayer](state.streams, update)


class AttnResReadout(nn.Module):
    """Model-level AttnRes ends: ``start(e)`` makes ``S = [e]`` and no partial sum;
    ``hidden = RMSNorm_f(Agg_f(S + [P]))`` (``3·D`` parameters with the final norm).

    Args:
        dim: ``D``; eps: RMSNorm epsilon.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.agg = DepthAttention(dim, eps)
        self.norm = RMSNorm(dim, eps)

    def start(self, e: torch.Tensor) -> ResidualState:
        return ResidualState(streams=(), sources=[e])

    def hidden(self, state: ResidualState) -> torch.Tensor:
        return self.norm(self.agg([*state.sources, *state.streams]))

    def stream(self, state: ResidualState) -> torch.Tensor:
        """``Σ S + P``: the plain residual stream (embedding plus every update) that AttnRes replaces."""
        return torch.stack([*state.sources, *state.streams]).sum(0)

    def forward(self, state: ResidualState) -> torch.Tensor:
        return self.hidden(state)


__all__ = ["AttnResReadout", "AttnResResidual", "DepthAttention", "block_of", "starts_block"]
