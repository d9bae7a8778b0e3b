"""Bench-only control models: the small attention and gated-convolution baselines the published
recall numbers are stated against (``docs/bench.md``, Models).

* ``attention`` mixer with ``learned`` positions, no MLP, LayerNorm and biases: the 2-layer
  attention of Zoology's Figure 2 (Arora et al., "Zoology: Measuring and Improving Recall in
  Efficient Language Models", arXiv:2312.04927).
* ``attention`` with ``rope`` positions and a GELU MLP (``mlp_ratio=4``): the T7 attention reference.
* ``shortconv``: a gated short convolution, ``out(conv_k(a) * b)`` with ``[a, b] = in(x)`` and a
  depthwise causal kernel of ``kernel_size`` taps (receptive field ``layers·(k-1)+1``): the negative
  control with no content-based read.
* ``longconv``: the same gate around an explicit causal filter of length ``max_len`` applied by FFT
  after the short convolution (a Hyena-like LTI long convolution; Poli et al., "Hyena Hierarchy",
  arXiv:2302.10866), plus a per-channel skip ``D``.

They are ``PreTrainedModel`` subclasses on the shared forward frame (``SLMForCausalLM``), so the
``Trainer``, checkpoints, ``scored_only`` and evaluation work unchanged; they keep no decoding cache
and refuse ``generate``. Their inference memory is given by :meth:`ControlForCausalLM.state_floats`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from ..layers.rotary import RotaryEmbedding, apply_rotary
from ..models.base import ForwardInputs, SLMBaseModel, SLMForCausalLM, SLMPreTrainedModel

MIXERS = ("attention", "shortconv", "longconv")
POSITIONS = ("learned", "rope", "none")


class ControlConfig(PretrainedConfig):
    """Config of a bench control model.

    Args:
        vocab_size: token ids ``[0, vocab_size)``.
        d_model: width ``d``.
        n_layers: blocks.
        mixer: ``attention``, ``shortconv`` or ``longconv``.
        n_heads: attention heads (``attention`` only).
        positions: ``learned`` (a ``max_len × d`` table), ``rope`` (rotary, attention only) or ``none``.
        mlp_ratio: GELU MLP of ``mlp_ratio·d`` after each mixer (0 = no MLP, Zoology's setting).
        kernel_size: short-convolution taps.
        max_len: longest sequence (the learned table and the long filter have this length); 0 = unbounded.
        dropout: embedding and attention dropout (Zoology uses 0.1).
    """

    model_type = "slmlab-control"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers"}

    def __init__(
        self, vocab_size: int = 1024, d_model: int = 64, n_layers: int = 2, mixer: str = "attention", n_heads: int = 1,
        positions: str = "learned", mlp_ratio: int = 0, kernel_size: int = 3, max_len: int = 64, dropout: float = 0.0,
        initializer_range: float = 0.02, tie_word_embeddings: bool = True, **kwargs,
    ) -> None:
        if mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}")
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if positions == "rope" and mixer != "attention":
            raise ValueError("positions='rope' needs mixer='attention'")
        if mixer == "attention" and (n_heads < 1 or d_model % n_heads or (d_model // n_heads) % 2):
            raise ValueError(f"d_model={d_model} must split into n_heads={n_heads} heads of even size")
        if (positions == "learned" or mixer == "longconv") and max_len < 1:
            raise ValueError(f"max_len must be >= 1 for learned positions or a long filter, got {max_len}")
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("n_layers", n_layers), ("kernel_size", kernel_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.vocab_size, self.d_model, self.n_layers, self.mixer = vocab_size, d_model, n_layers, mixer
        self.n_heads, self.positions, self.mlp_ratio, self.kernel_size = n_heads, positions, mlp_ratio, kernel_size
        self.max_len, self.dropout, self.initializer_range = max_len, dropout, initializer_range
        kwargs.pop("use_cache", None)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.use_cache = False  # no decoding cache: training and evaluation only

    @property
    def max_position_embeddings(self) -> int | None:
        """The length limit the forward frame checks (None: unbounded)."""
        return self.max_len if (self.positions == "learned" or self.mixer == "longconv") else None


class LearnedPositions(nn.Module):
    """Absolute position table ``[max_len, d]`` added to the embeddings."""

    def __init__(self, max_len: int, d: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_len, d)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table(position_ids)


class NoPositions(nn.Module):
    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros((), device=position_ids.device)


class Attention(nn.Module):
    """Causal multi-head attention with biases; optional RoPE on ``q, k``.

    Shapes: ``x [B, T, d]``, ``position_ids [B, T]`` -> ``[B, T, d]``.
    """

    def __init__(self, d: int, n_heads: int, rope: bool, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.rotary = RotaryEmbedding(d // n_heads) if rope else None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.rotary is not None:
            cos, sin = self.rotary(position_ids)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def causal_depthwise(conv: nn.Conv1d, u: torch.Tensor) -> torch.Tensor:
    """A depthwise ``Conv1d`` (padding ``k-1``) made causal: ``[B, d, T] -> [B, d, T]``."""
    return conv(u)[..., : u.shape[-1]]


class ShortConv(nn.Module):
    """Gated short convolution: ``out(conv_k(a) * b)``, ``[a, b] = in(x)``; ``x [B, T, d] -> [B, T, d]``."""

    def __init__(self, d: int, kernel_size: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d, 2 * d)
        self.conv = nn.Conv1d(d, d, kernel_size, groups=d, padding=kernel_size - 1)
        self.out = nn.Linear(d, d)

    def mix(self, u: torch.Tensor) -> torch.Tensor:
        """The sequence mixing of ``u [B, d, T]``."""
        return causal_depthwise(self.conv, u)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        a, b = self.inp(x).chunk(2, dim=-1)
        return self.out(self.mix(a.transpose(1, 2)).transpose(1, 2) * b)


class LongConv(ShortConv):
    """:class:`ShortConv` whose mixing is the short conv followed by an explicit causal filter
    ``h [d, max_len]`` (FFT, O(T log T)) plus a skip ``D``: ``y = h * conv_k(a) + D ⊙ conv_k(a)``."""

    def __init__(self, d: int, kernel_size: int, max_len: int) -> None:
        super().__init__(d, kernel_size)
        decay = torch.exp(-torch.arange(max_len, dtype=torch.float32) / max(max_len / 8, 1.0))
        self.filter = nn.Parameter(torch.randn(d, max_len) * 0.02 * decay)
        self.skip = nn.Parameter(torch.ones(d))

    def mix(self, u: torch.Tensor) -> torch.Tensor:
        s = causal_depthwise(self.conv, u)
        t = s.shape[-1]
        n = 2 * t
        y = torch.fft.irfft(torch.fft.rfft(s.float(), n=n) * torch.fft.rfft(self.filter[:, :t].float(), n=n), n=n)[..., :t]
        return y.to(s.dtype) + self.skip[:, None] * s


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class NoMLP(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros((), device=x.device, dtype=x.dtype)


class Block(nn.Module):
    """Pre-norm residual block: ``x + mixer(LN(x))``, then ``x + mlp(LN(x))`` (an identity-zero when no MLP)."""

    def __init__(self, config: ControlConfig) -> None:
        super().__init__()
        d = config.d_model
        self.norm = nn.LayerNorm(d)
        if config.mixer == "attention":
            self.mixer = Attention(d, config.n_heads, config.positions == "rope", config.dropout)
        elif config.mixer == "shortconv":
            self.mixer = ShortConv(d, config.kernel_size)
        else:
            self.mixer = LongConv(d, config.kernel_size, config.max_len)
        self.mlp_norm = nn.LayerNorm(d) if config.mlp_ratio else nn.Identity()
        self.mlp = MLP(d, config.mlp_ratio * d) if config.mlp_ratio else NoMLP()

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.norm(x), position_ids)
        return x + self.mlp(self.mlp_norm(x))


class ControlPreTrainedModel(SLMPreTrainedModel):
    config_class = ControlConfig

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class ControlModel(SLMBaseModel, ControlPreTrainedModel):
    """Embedding (+ positions, dropout), ``n_layers`` :class:`Block` s, final LayerNorm."""

    def __init__(self, config: ControlConfig) -> None:
        super().__init__(config)
        d = config.d_model
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.positions = LearnedPositions(config.max_len, d) if config.positions == "learned" else NoPositions()
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(d)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    def layer_loop(self, inputs: ForwardInputs) -> torch.Tensor:
        x = self.drop(inputs.embeds + self.positions(inputs.position_ids))
        for layer in self.layers:
            x = layer(x, inputs.position_ids)
            inputs.record(x)
        return self.norm(x)


class ControlForCausalLM(SLMForCausalLM, ControlPreTrainedModel):
    """A control model with a tied LM head. Training and evaluation only: ``generate`` raises."""

    base_model_class = ControlModel

    def generate(self, *args, **kwargs):
        raise TypeError(
            f"{type(self).__name__} is a bench-only control model without a decoding cache; it cannot generate."
            " Use a registered family (slmlab models) for generation"
        )

    def state_floats(self, T: int) -> int:
        """Numbers an inference of ``T`` tokens must keep besides the weights: K and V of every
        attention layer (``2·L·d·T``); the last ``k-1`` inputs of each short conv (``L·(k-1)·d``);
        a long filter needs the whole input history of its layer (``+ L·d·T``)."""
        c = self.config
        per_layer = {
            "attention": 2 * c.d_model * T,
            "shortconv": (c.kernel_size - 1) * c.d_model,
            "longconv": (c.kernel_size - 1) * c.d_model + c.d_model * T,
        }[c.mixer]
        return c.n_layers * per_layer


def _register() -> None:
    AutoConfig.register(ControlConfig.model_type, ControlConfig, exist_ok=True)
    AutoModelForCausalLM.register(ControlConfig, ControlForCausalLM, exist_ok=True)


_register()
__all__ = ["ControlConfig", "ControlForCausalLM", "ControlModel"]
