"""StackMemory (K. Zhang et al., "StackTrans: From Large Language Model to Large Pushdown Automata
Model", arXiv 2507.15343) as a residual flow of the standard pre-norm topology.

A differentiable soft stack of low-rank states is carried over depth, per token: at the start of
every decoder layer, each of ``H = num_mem_heads`` heads mixes push, pop and no-op with predicted
probabilities, reads its stack with a learned slot attention and adds the read-out to the stream
before attention (``docs/neollm-residual.md#stackmemory``). With ``d_s = stack_d_model / H``,
``S = stack_slots``, ``stack [B, T, H, S, d_s]`` and ``mask [B, T, H, S]`` (zeros at the input)::

    p = softmax((h W_act).view(B, T, H, 3) / sqrt(d_s))          # push, pop, no-op
    k = (h W_down).view(B, T, H, d_s)
    stack' = p_push·[k, stack[:-1]] + p_pop·[stack[1:], 0] + p_noop·stack    (mask' likewise, pushing 1)
    ω = softmax_S(stack'·w_gate + log(max(mask', 1e-6)));   r = Σ_S ω·stack'
    h ← h + ρ·(r.view(B, T, H·d_s) W_up)                          # ρ init 1

Decisions that differ from the released source: one global ``D → stack_d_model`` projection (not
one per head); empty slots are masked with ``log(mask)`` (the source's ``(1 − mask)·(−1e9)`` turns
soft masks into a hard argmax); the action temperature is ``sqrt(d_s)``; the source's training-time
cache shared across sequences (``stack_memory_cache_size``) is not built: the field is stored and
inert. The stack runs over depth, not time, so a decoding step is the same computation with
``T = 1`` and nothing is cached. Parameters per layer: ``3H·D + 2·stack_d_model·D + d_s + 1``
(38,921 at the defaults).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .context import ResidualState
from .residual import PreNormReadout, PreNormResidual

_MASK_FLOOR = 1e-6


class StackMemory(nn.Module):
    """One layer's soft stack update and read-out.

    Args:
        dim: ``D``; d_model: ``stack_d_model``; heads: ``num_mem_heads`` (``H``); slots: ``stack_slots`` (``S``).
    Shapes:
        h ``[B, T, D]``, stack ``[B, T, H, S, d_s]``, mask ``[B, T, H, S]`` -> (h, stack, mask), same shapes.
    """

    def __init__(self, dim: int, d_model: int, heads: int, slots: int) -> None:
        super().__init__()
        self.heads, self.slots, self.head_dim = heads, slots, d_model // heads
        self.action_proj = nn.Linear(dim, 3 * heads, bias=False)
        self.down_proj = nn.Linear(dim, d_model, bias=False)
        self.up_proj = nn.Linear(d_model, dim, bias=False)
        self.gate = nn.Parameter(torch.empty(self.head_dim))
        self.res_weight = nn.Parameter(torch.ones(()))
        nn.init.trunc_normal_(self.gate, std=0.02, a=-0.04, b=0.04)

    def reset_parameters_with(self, init_module) -> None:
        """``w_gate`` truncated normal (σ = 0.02), ``ρ = 1``; the projections are plain linears."""
        init_module.trunc_normal_(self.gate, mean=0.0, std=0.02, a=-0.04, b=0.04)
        init_module.ones_(self.res_weight)

    def actions(self, h: torch.Tensor) -> torch.Tensor:
        """``p [B, T, H, 3]`` (push, pop, no-op), in fp32."""
        logits = self.action_proj(h).float().unflatten(-1, (self.heads, 3))
        return (logits / math.sqrt(self.head_dim)).softmax(-1)

    @staticmethod
    def update(stack: torch.Tensor, mask: torch.Tensor, p: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The soft push / pop / no-op: ``p [B, T, H, 3]``, ``k [B, T, H, d_s]``."""
        push_s = torch.cat([k.unsqueeze(-2), stack[..., :-1, :]], dim=-2)
        pop_s = F.pad(stack[..., 1:, :], (0, 0, 0, 1))
        push_m = F.pad(mask[..., :-1], (1, 0), value=1.0)
        pop_m = F.pad(mask[..., 1:], (0, 1))
        p = p.to(stack.dtype)
        pu, po, no = p[..., 0], p[..., 1], p[..., 2]
        stack = pu[..., None, None] * push_s + po[..., None, None] * pop_s + no[..., None, None] * stack
        mask = pu[..., None] * push_m + po[..., None] * pop_m + no[..., None] * mask
        return stack, mask

    def read_weights(self, stack: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Slot attention ``ω [B, T, H, S]``: ``softmax_S(stack·w_gate + log(max(mask, 1e-6)))`` (fp32)."""
        score = stack.float() @ self.gate.float()
        return (score + mask.float().clamp(min=_MASK_FLOOR).log()).softmax(-1)

    def forward(self, h: torch.Tensor, stack: torch.Tensor, mask: torch.Tensor):
        k = self.down_proj(h).unflatten(-1, (self.heads, self.head_dim))
        stack, mask = self.update(stack, mask, self.actions(h), k)
        omega = self.read_weights(stack, mask).to(stack.dtype)
        r = (omega.unsqueeze(-1) * stack).sum(-2).flatten(-2)
        return h + self.res_weight.to(h.dtype) * self.up_proj(r), stack, mask


class StackMemoryResidual(PreNormResidual):
    """The pre-norm flow with StackMemory before attention: ``h, stack, mask ← StackMemory(h, stack,
    mask)``, then ``RMSNorm_attn(h)``; the MLP side and the adds are the standard ones.

    Args:
        dim, layer_idx, eps, input_norm: as :class:`PreNormResidual`.
        d_model, heads, slots: ``stack_d_model``, ``num_mem_heads``, ``stack_slots``.
    Shapes:
        state.streams ``(h,)``; state.stack ``(stack [B, T, H, S, d_s], mask [B, T, H, S])``.
    """

    def __init__(self, dim: int, layer_idx: int, eps: float = 1e-6, input_norm: bool = True, *, d_model: int = 32,
                 heads: int = 4, slots: int = 16) -> None:
        super().__init__(dim, layer_idx, eps, input_norm)
        self.stack_memory = StackMemory(dim, d_model, heads, slots)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> StackMemoryResidual:
        return cls(config.hidden_size, layer_idx, config.rms_norm_eps, config.use_embedding_input_norm,
                   d_model=config.stack_d_model, heads=config.num_mem_heads, slots=config.stack_slots)

    def attn_input(self, state: ResidualState) -> torch.Tensor:
        h, stack, mask = self.stack_memory(state.streams[0], *state.stack)
        state.streams, state.stack = (h,), (stack, mask)
        return self.attn_norm(h)


class StackMemoryReadout(PreNormReadout):
    """Model-level ends of the StackMemory flow: ``start(e)`` holds ``(e,)`` and an empty stack
    (zeros); ``hidden = RMSNorm_f(h)``.

    Args:
        dim: ``D``; eps: RMSNorm epsilon; d_model, heads, slots: the stack's shape.
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, d_model: int = 32, heads: int = 4, slots: int = 16) -> None:
        super().__init__(dim, eps)
        self.heads, self.slots, self.head_dim = heads, slots, d_model // heads

    @classmethod
    def from_config(cls, config) -> StackMemoryReadout:
        return cls(config.hidden_size, config.rms_norm_eps, d_model=config.stack_d_model,
                   heads=config.num_mem_heads, slots=config.stack_slots)

    def start(self, e: torch.Tensor) -> ResidualState:
        stack = e.new_zeros(*e.shape[:-1], self.heads, self.slots, self.head_dim)
        return ResidualState(streams=(e,), stack=(stack, stack[..., 0]))


__all__ = ["StackMemory", "StackMemoryReadout", "StackMemoryResidual"]
