"""The NeoLLM feed-forward block (docs/neollm-residual.md#mlp-and-activations): FAN input map, gated MLP with xIELU on the gate
branch, dropout on the intermediate, learnable multipliers on ``gate_proj`` (row) and ``down_proj``
(row + column).

``MLP(u) = down_proj(Dropout(act(gate_proj(X)) ⊙ up_proj(X)))`` with ``X = FAN_ffn(u)``.
Gated MLP as in Shazeer, "GLU Variants Improve Transformer", arXiv 2002.05202.
"""

from __future__ import annotations

import torch
from torch import nn

from .activations import make_activation
from .fan import make_fan
from .multipliers import multiplied_linear


class NeoLLMMLP(nn.Module):
    """Position-wise gated MLP; stateless for decoding.

    Args:
        hidden_size: model width ``D``.
        intermediate_size: inner width ``I``.
        fan_ratio: ``fan_ratio_ffn``; ``int(D·ratio) = 0`` means no FAN map (input width ``D``).
        hidden_act: activation of the gate branch (``"xielu"``: a trainable fp32 xIELU per layer).
        dropout: ``dropout_rate``, applied to ``act(g) ⊙ v`` before ``down_proj`` (training only).
        use_multipliers: ``use_learnable_multipliers``.
        polynorm_exclusive: PolyNorm instead of ``hidden_act`` (``docs/neollm-residual.md#polynorm``).
        eps: PolyNorm's ``ε``.
    Shapes:
        u ``[B, T, D]`` -> ``[B, T, D]``.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        fan_ratio: float = 0.0,
        hidden_act: str = "xielu",
        dropout: float = 0.0,
        use_multipliers: bool = True,
        polynorm_exclusive: bool = False,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.fan = make_fan(hidden_size, fan_ratio)
        width = self.fan.out_features
        self.gate_proj = multiplied_linear(width, intermediate_size, row=True, enabled=use_multipliers)
        self.up_proj = nn.Linear(width, intermediate_size, bias=False)
        self.down_proj = multiplied_linear(intermediate_size, hidden_size, row=True, col=True, enabled=use_multipliers)
        self.act_fn = make_activation(hidden_act, polynorm_exclusive, eps)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> NeoLLMMLP:
        """The MLP of layer ``layer_idx`` (every layer has the same one)."""
        return cls(
            config.hidden_size,
            config.intermediate_size,
            fan_ratio=config.fan_ratio_ffn,
            hidden_act=config.hidden_act,
            dropout=config.dropout_rate,
            use_multipliers=config.use_learnable_multipliers,
            polynorm_exclusive=config.polynorm_exclusive,
            eps=config.rms_norm_eps,
        )

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        x = self.fan(u)
        return self.down_proj(self.dropout(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))
