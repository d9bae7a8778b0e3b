"""Residual flows of the NeoLLM decoder layer (``docs/neollm-residual.md``).

A residual flow owns the norms around one decoder layer's two sublayers and the rule that adds a
sublayer's update to the residual stream(s); it implements :class:`~.context.ResidualFlow` over the
typed :class:`~.context.ResidualState`. The decoder layer composes it without branching::

    u = flow.attn_input(state);  flow.add(state, Dropout(Attn(u, ctx, cache, state)))
    u = flow.mlp_input(state);   flow.add(state, MLP(u))

``state.streams`` is a tuple of ``[B, T, D]`` tensors: ``(x, y)`` for SiameseNorm, ``(h,)`` for the
standard pre-norm topology. A model-level *readout* (:class:`~.context.FlowEnds`) builds the first
state from the embedding (``start``) and turns the last one into the final hidden state (``hidden``).

SiameseNorm: Li, Han et al., "SiameseNorm: Breaking the Barrier to Reconciling Pre/Post-Norm",
arXiv 2602.08064. Two streams start at the embedding ``e``; ``x`` is bounded (post-normed before
every sublayer), ``y`` unbounded. Sublayer input ``u = RMSNorm_i(s ⊙ RMSNorm_x(x) + RMSNorm_y(y))``
(``s`` only on the attention side, NeoLLM's addition); update ``x ← x + a / c_l``, ``y ← y + a`` with
``c_l = sqrt(2(l+1))``; read-out ``RMSNorm_f(RMSNorm_fx(x) + RMSNorm_fy(y))``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ....layers.norm import RMSNorm
from .context import ResidualState

Streams = tuple[torch.Tensor, ...]


class SiameseFuse(nn.Module):
    """MLP-side SiameseNorm input: post-norm the bounded stream and fuse it with the pre-normed
    unbounded one, ``x ← RMSNorm_x(x)``, ``u = RMSNorm_i(x + RMSNorm_y(y))``. ``RMSNorm_i`` is the
    identity when ``siamese_normalized_input=False``.

    Args:
        dim: model width ``D``.
        eps: RMSNorm epsilon.
        normalized_input: build the input norm ``RMSNorm_i``.
    Shapes:
        x, y ``[B, T, D]`` -> (new x ``[B, T, D]``, u ``[B, T, D]``).
    """

    def __init__(self, dim: int, eps: float, normalized_input: bool) -> None:
        super().__init__()
        self.x_norm = RMSNorm(dim, eps)
        self.y_norm = RMSNorm(dim, eps)
        self.input_norm = RMSNorm(dim, eps) if normalized_input else nn.Identity()

    def _bounded(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x_norm(x)
        return x, self.input_norm(self._bounded(x) + self.y_norm(y))


class SiameseAttnFuse(SiameseFuse):
    """Attention-side SiameseNorm input: as :class:`SiameseFuse` with NeoLLM's learnable elementwise
    scale ``s`` (init ``siamese_attn_x_scale_init``) on the bounded stream,
    ``u = RMSNorm_i(s ⊙ x + RMSNorm_y(y))``.

    Args:
        dim, eps, normalized_input: as :class:`SiameseFuse`.
        x_scale_init: init value of ``s``.
    """

    def __init__(self, dim: int, eps: float, normalized_input: bool, x_scale_init: float = 1.0) -> None:
        super().__init__(dim, eps, normalized_input)
        self.x_scale_init = float(x_scale_init)
        self.x_scale = nn.Parameter(torch.full((dim,), self.x_scale_init))

    def reset_parameters_with(self, init_module) -> None:
        """Set ``s`` back to its init value (the norms are re-initialised by type)."""
        init_module.constant_(self.x_scale, self.x_scale_init)

    def _bounded(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.x_scale.to(x.dtype)


class RawStreamInput(nn.Module):
    """Layer 0 without the embedding input norm (``use_embedding_input_norm=False``): no modules,
    the sublayer reads the raw embedding ``x`` (= ``y`` = ``e`` at layer 0)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


class SiameseResidual(nn.Module):
    """SiameseNorm for one decoder layer ``l``: attention-side and MLP-side fusion plus the
    two-stream update (7·D parameters: six RMSNorm weights and ``s``).

    Args:
        dim: model width ``D``.
        layer_idx: ``l`` (0-based); the depth scale is ``c_l = sqrt(2(l+1))``.
        eps: RMSNorm epsilon.
        x_scale_init: ``siamese_attn_x_scale_init``.
        normalized_input: ``siamese_normalized_input``.
        depth_scaling: ``siamese_depth_scaling`` (``c_l = 1`` when False).
        input_norm: ``use_embedding_input_norm``; at ``l = 0`` False builds no attention-side
            modules and feeds the raw embedding to attention
            (``docs/neollm-residual.md#siamesenorm``).
    """

    junction = 1  # GPAS gates the unbounded stream y after each add (docs/neollm-residual.md#gpas)

    def __init__(
        self,
        dim: int,
        layer_idx: int,
        eps: float = 1e-6,
        x_scale_init: float = 1.0,
        normalized_input: bool = True,
        depth_scaling: bool = True,
        input_norm: bool = True,
    ) -> None:
        super().__init__()
        raw = layer_idx == 0 and not input_norm
        self.attn_fuse = RawStreamInput() if raw else SiameseAttnFuse(dim, eps, normalized_input, x_scale_init)
        self.mlp_fuse = SiameseFuse(dim, eps, normalized_input)
        self.inv_depth_scale = 1.0 / math.sqrt(2 * (layer_idx + 1)) if depth_scaling else 1.0

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """SiameseNorm (``use_siamesenorm``, default) or its twin, the standard pre-norm flow."""
        if not config.use_siamesenorm:
            return PreNormResidual(config.hidden_size, layer_idx, config.rms_norm_eps, config.use_embedding_input_norm)
        return cls(
            config.hidden_size,
            layer_idx,
            eps=config.rms_norm_eps,
            x_scale_init=config.siamese_attn_x_scale_init,
            normalized_input=config.siamese_normalized_input,
            depth_scaling=config.siamese_depth_scaling,
            input_norm=config.use_embedding_input_norm,
        )

    def attn_input(self, state: ResidualState) -> torch.Tensor:
        x, y = state.streams
        x, u = self.attn_fuse(x, y)
        state.streams = (x, y)
        return u

    def mlp_input(self, state: ResidualState) -> torch.Tensor:
        x, y = state.streams
        x, u = self.mlp_fuse(x, y)
        state.streams, state.mlp_stream = (x, y), y
        return u

    def add(self, state: ResidualState, update: torch.Tensor) -> None:
        x, y = state.streams
        state.streams = (x + update * self.inv_depth_scale, y + update)


class PreNormResidual(nn.Module):
    """The standard pre-norm topology (``use_siamesenorm=False``): ``h ← h + f(RMSNorm(h))``.

    Args:
        dim: model width ``D``.
        layer_idx: ``l``; at ``l = 0`` with ``input_norm=False`` the attention pre-norm is not built.
        eps: RMSNorm epsilon.
        input_norm: ``use_embedding_input_norm``.
    """

    junction = 0  # the index in ``state.streams`` of the stream GPAS gates after each add

    def __init__(self, dim: int, layer_idx: int, eps: float = 1e-6, input_norm: bool = True) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if (layer_idx == 0 and not input_norm) else RMSNorm(dim, eps)
        self.mlp_norm = RMSNorm(dim, eps)

    def attn_input(self, state: ResidualState) -> torch.Tensor:
        return self.attn_norm(state.streams[0])

    def mlp_input(self, state: ResidualState) -> torch.Tensor:
        state.mlp_stream = state.streams[0]
        return self.mlp_norm(state.mlp_stream)

    def add(self, state: ResidualState, update: torch.Tensor) -> None:
        state.streams = (state.streams[0] + update,)


class SiameseReadout(nn.Module):
    """Model-level SiameseNorm ends: ``start(e)`` holds the streams ``(e, e)``; ``hidden`` (= ``forward``)
    gives ``RMSNorm_f(RMSNorm_fx(x) + RMSNorm_fy(y))`` (3·D parameters).

    Args:
        dim: model width ``D``; eps: RMSNorm epsilon.
    Shapes:
        e ``[B, T, D]``; state with streams ``(x, y)`` -> ``[B, T, D]``.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.x_norm = RMSNorm(dim, eps)
        self.y_norm = RMSNorm(dim, eps)
        self.norm = RMSNorm(dim, eps)

    @classmethod
    def from_config(cls, config, layer_idx: int | None = None) -> nn.Module:
        """The model-level ends matching :meth:`SiameseResidual.from_config` (``layer_idx`` unused)."""
        if not config.use_siamesenorm:
            return PreNormReadout(config.hidden_size, config.rms_norm_eps)
        return cls(config.hidden_size, config.rms_norm_eps)

    def start(self, e: torch.Tensor) -> ResidualState:
        return ResidualState(streams=(e, e))

    def hidden(self, state: ResidualState) -> torch.Tensor:
        x, y = state.streams
        return self.norm(self.x_norm(x) + self.y_norm(y))

    def stream(self, state: ResidualState) -> torch.Tensor:
        """The unbounded stream ``y`` (what ``output_hidden_states`` records per layer)."""
        return state.streams[1]

    def forward(self, state: ResidualState) -> torch.Tensor:
        return self.hidden(state)


class PreNormReadout(nn.Module):
    """Model-level ends of the standard topology: ``start(e)`` holds ``(e,)``, ``hidden = RMSNorm_f(h)``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, eps)

    def start(self, e: torch.Tensor) -> ResidualState:
        return ResidualState(streams=(e,))

    def hidden(self, state: ResidualState) -> torch.Tensor:
        return self.norm(state.streams[0])

    def stream(self, state: ResidualState) -> torch.Tensor:
        """The residual stream ``h``."""
        return state.streams[0]

    def forward(self, state: ResidualState) -> torch.Tensor:
        return self.hidden(state)
