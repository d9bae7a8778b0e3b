"""SAGE-Lumen configuration (seed 002)."""

from __future__ import annotations

from transformers import PretrainedConfig

from ...layers.attention import check_head_layout
from ..registry import KeepsSavedKeys, accept_keywords, check_positive_ints, config_signature


@config_signature()
class LumenConfig(KeepsSavedKeys, PretrainedConfig):
    """A tiny Llama-style decoder: MQA/GQA attention with RoPE, SwiGLU, RMSNorm, tied embeddings.

    Every field of the seed's ``LumenConfig`` is accepted under its own name and default; the
    transformers names (``hidden_size``, ``num_hidden_layers``, ...) are aliases of the same values.
    Typed, as every family config: the fields are annotated class attributes, ``head_dim``
    (``hidden_dim // num_heads``) is derived and the sizes checked in ``__post_init__``.

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

    vocab_size: int = 2048
    hidden_dim: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 1
    intermediate_dim: int = 512
    max_seq_len: int = 1024
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        """Called by the generated ``__init__`` once the fields are assigned, with the keywords that are not
        fields: derives ``head_dim``, checks the sizes, then runs transformers' post-init and validators. An
        unknown keyword (a typo) raises ``ValueError`` with "did you mean" (:func:`reject_unknown_keys`)."""
        accept_keywords(self, kwargs)
        check_positive_ints(self, ("vocab_size", "hidden_dim", "num_layers", "max_seq_len"))
        self.head_dim = check_head_layout(self.hidden_dim, self.num_heads, self.num_kv_heads, None)
        if int(self.intermediate_dim) < 0:
            raise ValueError(f"intermediate_dim must be >= 0 (0 = no MLP sublayer), got {self.intermediate_dim!r}")
        if self.head_dim % 2:
            raise ValueError(f"head dimension hidden_dim/num_heads = {self.head_dim} must be even for RoPE")
        # bos/eos/pad ids: None until `slmlab train` records its tokenizer's (so generate() stops at eos)
        super().__post_init__(**{"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **kwargs})
        self.validate()  # transformers' class validators, as its own __init__ runs them
