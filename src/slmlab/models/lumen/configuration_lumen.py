"""SAGE-Lumen configuration (seed 002)."""

from __future__ import annotations

from transformers import PretrainedConfig

from ...layers.attention import check_head_layout
from ..registry import KeepsSavedKeys, reject_unknown_keys


class LumenConfig(KeepsSavedKeys, PretrainedConfig):
    """A tiny Llama-style decoder: MQA/GQA attention with RoPE, SwiGLU, RMSNorm, tied embeddings.

    Every field of the seed's ``LumenConfig`` is accepted under its own name and default; the
    transformers names (``hidden_size``, ``num_hidden_layers``, ...) are aliases of the same values.

    Args:
        vocab_size: 2048.
        hidden_dim: model width ``d`` (256).
        num_layers: decoder blocks (4).
        num_heads: query heads (4).
        num_kv_heads: key/value heads (1 = MQA; any divisor of ``num_heads`` = GQA).
        intermediate_dim: SwiGLU inner width (512); 0 builds attention-only blocks without the MLP
            sublayer (Zoology's convention for MQAR: an MLP lets a small model memorise the fixed
            training set instead of learning the induction circuit, measured in ``docs/lumen.md``).
        max_seq_len: longest sequence the model accepts (1024).
        rms_norm_eps: 1e-6.
        rope_theta: 10000.0.
        tie_word_embeddings: share the embedding table with the LM head (True, as in the seed).
        initializer_range: std of the normal init (0.02).
        use_cache: return a decoding cache from ``forward`` by default (True).
    """

    model_type = "sage_lumen"
    attribute_map = {
        "hidden_size": "hidden_dim",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_heads",
        "num_key_value_heads": "num_kv_heads",
        "intermediate_size": "intermediate_dim",
        "max_position_embeddings": "max_seq_len",
    }

    def __init__(
        self,
        vocab_size: int = 2048,
        hidden_dim: int = 256,
        num_layers: int = 4,
        num_heads: int = 4,
        num_kv_heads: int = 1,
        intermediate_dim: int = 512,
        max_seq_len: int = 1024,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        tie_word_embeddings: bool = True,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        **kwargs,
    ) -> None:
        reject_unknown_keys(self, kwargs)  # a typo raises, with "did you mean"
        self.vocab_size = vocab_size
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.intermediate_dim = intermediate_dim
        self.max_seq_len = max_seq_len
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self.head_dim = check_head_layout(hidden_dim, num_heads, num_kv_heads, None)
        for name in ("vocab_size", "hidden_dim", "num_layers", "max_seq_len"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if int(intermediate_dim) < 0:
            raise ValueError(f"intermediate_dim must be >= 0 (0 = no MLP sublayer), got {intermediate_dim!r}")
        if self.head_dim % 2:
            raise ValueError(f"head dimension hidden_dim/num_heads = {self.head_dim} must be even for RoPE")
        # bos/eos/pad ids: None until `slmlab train` records its tokenizer's (so generate() stops at eos)
        kwargs = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **kwargs}
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
