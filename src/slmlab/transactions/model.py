"""The transaction encoder: structured embedding -> LFM2 backbone -> per-feature LM heads.

``TransactionEncoder`` is a Hugging Face ``PreTrainedModel`` (registered with ``AutoConfig`` /
``AutoModel``; not a causal text LM). Its config holds the backbone config and the schema (fitted
when known) as plain dicts, so a checkpoint folder is self-contained. ``forward(input_ids [B,T,F],
attention_mask, labels)`` returns the pretraining loss when ``labels`` (the same ids) are given.

The fine-tuned models (:mod:`slmlab.transactions.heads`) are :class:`TxnHeadModel` subclasses: the
encoder plus a head, configured by a :class:`TxnHeadConfig` subclass that adds the head's own fields
to the encoder's. Checkpoints written before the heads had their own configs (every head option in the
encoder's config, ``model_type`` ``slmlab_txn_encoder``) still load: the encoder ignores the options
it does not use and a head config reads its own from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import yaml
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from ..models.lfm2 import Lfm2SmallBackbone, Lfm2SmallConfig
from ..models.registry import config_signature
from .data.schema import CONFIGS, DEFAULT_SCHEMA, FittedSchema, SchemaConfig, load_schema, schema_from_dict
from .embedding import PerFeatureLMHeads, StructuredEmbedding

DEFAULT_MODEL_YAML = CONFIGS / "model.yaml"
# The head options an encoder config held before each head had its own config: an old config.json may
# still carry them; they are never copied from an encoder into a head's config.
LEGACY_HEAD_FIELDS = ("fraud_hidden", "fraud_dropout", "freeze_backbone", "pos_weight", "fraud_loss", "focal_gamma",
                      "fraud_head_inputs", "sequence_recent_k", "customer_dim", "customer_tau")

# Named presets: backbone overrides, window length and hash bucket counts (docs/transactions.md).
PRESETS: dict[str, dict] = {
    "lfm2_small": {"backbone": {}, "num_transactions": 64, "buckets": {}},
    "lfm2_tiny": {
        "backbone": {"hidden_size": 64, "intermediate_size": 256, "num_layers": 4,
                     "layer_order": ["conv", "attn", "conv", "attn"], "num_attention_heads": 4, "num_key_value_heads": 2},
        "num_transactions": 16,
        "buckets": {"merchant_id": 1020, "device_id": 508},
    },
}


def _schema_dict(schema: SchemaConfig | FittedSchema | dict | None) -> dict:
    if schema is None:
        return {"schema": load_schema().to_dict(), "fitted": None}
    if isinstance(schema, FittedSchema):
        return schema.to_dict()
    if isinstance(schema, SchemaConfig):
        return {"schema": schema.to_dict(), "fitted": None}
    return dict(schema)


@config_signature()
class TxnEncoderConfig(PretrainedConfig):
    """Config of :class:`TransactionEncoder` (a head's config adds its own fields: :class:`TxnHeadConfig`).

    Typed, as every config: annotated fields with defaults, normalised and checked in ``__post_init__``.

    Args:
        backbone: ``Lfm2SmallConfig`` keyword arguments.
        schema: ``{"schema": SchemaConfig dict, "fitted": {...} | None, "info": {...}}``.
        max_transactions: largest window ``T`` (rows of the transaction-index table).
        lm_head_bias: per-feature output biases (default off: the seed's accounting).
        initializer_range: normal init std.
    """

    model_type = "slmlab_txn_encoder"

    backbone: dict | None = None  # None -> {} (the backbone's defaults)
    schema: dict | None = None  # None -> the shipped schema, unfitted
    max_transactions: int = 64
    lm_head_bias: bool = False
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        """Called by the generated ``__init__`` once the fields are assigned, with the keywords that are not
        fields (passed on to transformers' post-init): normalises the fields, then checks the window length
        against the backbone's context."""
        given = self.max_transactions
        self.backbone = dict(self.backbone or {})
        self.schema = _schema_dict(self.schema)
        self.max_transactions = int(self.max_transactions)
        self.lm_head_bias = bool(self.lm_head_bias)
        super().__post_init__(**kwargs)
        self.validate()  # transformers' class validators, as its own __init__ runs them
        if self.max_transactions <= 0:
            raise ValueError(f"max_transactions must be a positive integer, got {given!r}")
        need = self.max_transactions * len(self.schema_config.features)
        if self.backbone_config().max_position_embeddings < need:
            raise ValueError(f"backbone.max_position_embeddings must be >= T*F = {need}")

    @property
    def schema_config(self) -> SchemaConfig:
        return schema_from_dict(self.schema["schema"])

    @property
    def fitted_schema(self) -> FittedSchema | None:
        return FittedSchema.from_dict(self.schema) if self.schema.get("fitted") is not None else None

    def backbone_config(self) -> Lfm2SmallConfig:
        kwargs = {"vocab_size": 1, **self.backbone}
        kwargs.setdefault("num_features", len(self.schema["schema"]["features"]))
        kwargs.setdefault("num_transactions", self.max_transactions)
        return Lfm2SmallConfig(**kwargs)

    def encoder_dict(self) -> dict:
        """This config as keyword arguments without any head option (the part every transaction model
        shares): what a head's config starts from."""
        skip = {"model_type", *LEGACY_HEAD_FIELDS, *TxnHeadConfig.all_head_fields()}
        return {k: v for k, v in self.to_dict().items() if k not in skip}

    @classmethod
    def from_preset(cls, name: str, schema: SchemaConfig | FittedSchema | None = None, **overrides) -> TxnEncoderConfig:
        """A preset of :data:`PRESETS`; ``schema`` defaults to the shipped one with the preset's buckets
        (``overrides``: any field of ``cls``, e.g. a head's options when ``cls`` is a head config)."""
        if name not in PRESETS:
            raise ValueError(f"unknown transaction model preset {name!r}; presets: {sorted(PRESETS)}")
        preset = PRESETS[name]
        if schema is None:
            schema = preset_schema(name)
        overrides.setdefault("max_transactions", preset["num_transactions"])
        return cls(backbone=dict(preset["backbone"]), schema=schema, **overrides)


def preset_schema(name: str, path: str | Path | None = None) -> SchemaConfig:
    """The schema (default: shipped) with the hash bucket counts of preset ``name``."""
    base = yaml.safe_load(Path(path or DEFAULT_SCHEMA).read_text())
    buckets = PRESETS[name]["buckets"]
    for feat in base["features"]:
        if feat["name"] in buckets:
            feat["encoding"]["buckets"] = buckets[feat["name"]]
    base.setdefault("sequence", {})["num_transactions"] = PRESETS[name]["num_transactions"]
    return schema_from_dict(base, where=f"preset {name}")


@dataclass
class TxnEncoderOutput(ModelOutput):
    """``loss`` (feature-balanced pretraining CE, when labels are given), ``last_hidden_state``
    ``[B, T*F, D]`` and ``per_feature`` (``name -> (ce_sum, correct, count)``)."""

    loss: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    per_feature: dict | None = None


def txn_mask_from(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` transaction mask from a token-level ``[B, T*F]`` or row-level ``[B, T]`` mask
    (default: rows with any non-PAD id)."""
    B, T, F = input_ids.shape
    if attention_mask is None:
        return (input_ids != 0).any(-1)
    if attention_mask.shape == (B, T * F):
        return attention_mask.view(B, T, F)[..., 0].bool()
    if attention_mask.shape == (B, T):
        return attention_mask.bool()
    raise ValueError(f"attention_mask must be [B, T*F] or [B, T], got {tuple(attention_mask.shape)}")


class TxnPreTrainedModel(PreTrainedModel):
    config_class = TxnEncoderConfig
    base_model_prefix = "encoder"
    supports_gradient_checkpointing = False

    def _init_weights(self, module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d)):
            torch.nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, StructuredEmbedding):
            module.reset_parameters()


class TransactionEncoder(TxnPreTrainedModel):
    """Structured embedding + ``Lfm2SmallBackbone`` + tied :class:`PerFeatureLMHeads`.

    Shapes: ``input_ids [B, T, F]`` -> hidden ``[B, T*F, D]`` -> per-feature logits.
    """

    def __init__(self, config: TxnEncoderConfig) -> None:
        super().__init__(config)
        schema = config.schema_config
        fitted = config.fitted_schema
        if fitted is not None and tuple(fitted.schema.vocab_sizes) != tuple(schema.vocab_sizes):
            raise ValueError("the fitted schema's vocabulary sizes differ from the model's tables")
        self.feature_names = list(schema.names)
        self.score_index = schema.score_index
        bb = config.backbone_config()
        self.embedding = StructuredEmbedding(schema.vocab_sizes, schema.names, bb.hidden_size, config.max_transactions,
                                             config.initializer_range)
        self.backbone = Lfm2SmallBackbone(bb)
        self.lm_heads = PerFeatureLMHeads(self.embedding, bias=config.lm_head_bias)
        self.post_init()
        self.embedding.zero_pad_rows()

    # -- the seed's API ------------------------------------------------------------------------
    def backbone_forward(self, token_ids: torch.Tensor, txn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T, F]`` ids -> ``[B, T*F, D]`` states after ``embedding_norm`` (padding masked)."""
        if txn_mask is None:
            txn_mask = (token_ids != 0).any(-1)
        x = self.embedding(token_ids, txn_mask)
        F = token_ids.shape[-1]
        mask = txn_mask.repeat_interleave(F, dim=1).long()
        return self.backbone(inputs_embeds=x, attention_mask=mask, use_cache=False).last_hidden_state

    def per_feature_logits(self, token_ids: torch.Tensor, txn_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Every head at every position: ``F`` tensors ``[B, T*F, V_f]`` (the seed's ``forward``)."""
        return self.lm_heads(self.backbone_forward(token_ids, txn_mask))

    def param_count(self) -> dict[str, int]:
        """Parameters by component (tied heads count 0)."""
        emb = sum(p.numel() for p in self.embedding.parameters())
        backbone = sum(p.numel() for p in self.backbone.parameters())
        heads = sum(p.numel() for p in self.lm_heads.parameters())
        total = sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
        return {"embedding": emb, "backbone": backbone, "lm_heads_tied": heads, "total_unique": total}

    @classmethod
    def from_config_files(cls, model_yaml: str | Path | None = None, schema_yaml: str | Path | None = None,
                          ) -> TransactionEncoder:
        """Build from the seed's ``model.yaml`` layout and a schema YAML (defaults: the shipped ones)."""
        bb = Lfm2SmallConfig.from_yaml(model_yaml or DEFAULT_MODEL_YAML)
        schema = load_schema(schema_yaml, features_per_transaction=bb.num_features)
        keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_layers",
                "layer_order", "conv_kernel_size", "block_auto_adjust_ff_dim", "block_multiple_of",
                "block_ffn_dim_multiplier", "rms_norm_eps", "rope_theta", "max_position_embeddings")
        backbone = {k: getattr(bb, k) for k in keys}
        return cls(TxnEncoderConfig(backbone=backbone, schema=schema, max_transactions=bb.num_transactions,
                                    initializer_range=bb.initializer_range))

    # -- HF forward ----------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> TxnEncoderOutput:
        """Args:
            input_ids: ``[B, T, F]``.
            attention_mask: token-level ``[B, T*F]`` or row-level ``[B, T]``.
            labels: the ids again (``[B, T, F]``): the next-token targets; gives ``loss``.
        """
        txn_mask = txn_mask_from(input_ids, attention_mask)
        hidden = self.backbone_forward(input_ids, txn_mask)
        loss = per_feature = None
        if labels is not None:
            loss, per_feature = self.lm_heads.lm_loss(hidden, labels, txn_mask, self.feature_names)
        return TxnEncoderOutput(loss=loss, last_hidden_state=hidden, per_feature=per_feature)


@config_signature()
class TxnHeadConfig(TxnEncoderConfig):
    """Base of the fine-tuned models' configs: the encoder's fields, ``freeze_backbone`` and, in each
    subclass, the head's own fields (annotated, named in its ``HEAD_FIELDS``; the subclass's
    ``__post_init__`` normalises them, passes the other keywords on, then checks them).

    Args:
        freeze_backbone: linear-probe mode (embedding and backbone frozen).
    """

    model_type = "slmlab_txn_head"
    HEAD_FIELDS: ClassVar[tuple[str, ...]] = ("freeze_backbone",)
    _registry: ClassVar[list[type]] = []

    freeze_backbone: bool = False

    def __init_subclass__(cls, **kwargs) -> None:
        """Register every head config (:meth:`all_head_fields`) and show its keywords on its ``__init__``."""
        super().__init_subclass__(**kwargs)
        config_signature()(cls)
        TxnHeadConfig._registry.append(cls)

    def __post_init__(self, **kwargs):
        self.freeze_backbone = bool(self.freeze_backbone)
        super().__post_init__(**kwargs)

    @classmethod
    def all_head_fields(cls) -> set[str]:
        """Every head field of every head config defined so far."""
        return {f for c in (TxnHeadConfig, *TxnHeadConfig._registry) for f in c.HEAD_FIELDS}

    @classmethod
    def own_fields(cls) -> tuple[str, ...]:
        """``freeze_backbone`` and this head's ``HEAD_FIELDS``."""
        return tuple(dict.fromkeys((*TxnHeadConfig.HEAD_FIELDS, *cls.HEAD_FIELDS)))

    @classmethod
    def from_config(cls, config: TxnEncoderConfig, **overrides) -> TxnHeadConfig:
        """A config of this head from any transaction config: its encoder part, the fields of this head
        that ``config`` holds (its own, or left in an old encoder config), then ``overrides``."""
        own = {f: getattr(config, f) for f in cls.own_fields() if hasattr(config, f)}
        return cls(**{**config.encoder_dict(), **own, **overrides})

    @classmethod
    def get_config_dict(cls, *args, **kwargs):
        """Hugging Face's reader; a checkpoint saved before the heads had their own configs says
        ``model_type: slmlab_txn_encoder`` and is read as this head's config (no mismatch warning)."""
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        if config_dict.get("model_type") == TxnEncoderConfig.model_type:
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs


def encoder_of(model) -> TransactionEncoder:
    """The :class:`TransactionEncoder` of ``model``: the model itself or its ``encoder`` attribute
    (fine-tuned models such as ``TransactionFraudModel`` hold one)."""
    if isinstance(model, TransactionEncoder):
        return model
    enc = getattr(model, "encoder", None)
    if isinstance(enc, TransactionEncoder):
        return enc
    raise ValueError(f"{type(model).__name__} is not a transaction encoder and holds none; pass a TransactionEncoder"
                     " or a fine-tuned transaction model")


class TxnHeadModel(TxnPreTrainedModel):
    """Base of the fine-tuned models: ``encoder`` (a :class:`TransactionEncoder`, built here) plus a head
    that the subclass builds in ``__init__`` (after ``super().__init__(config)``, reading ``self.config``)
    before calling :meth:`_finish_init`. ``config_class`` is the head's :class:`TxnHeadConfig`
    subclass; a config of another class (an encoder's, another head's) is converted with
    :meth:`TxnHeadConfig.from_config`."""

    config_class = TxnHeadConfig

    def __init__(self, config: TxnEncoderConfig) -> None:
        if not isinstance(config, self.config_class):
            config = self.config_class.from_config(config)
        super().__init__(config)
        self.encoder = TransactionEncoder(self.config)

    def _finish_init(self) -> None:
        """Hugging Face init of the new head, PAD rows of the embedding re-zeroed, and the encoder
        frozen when ``config.freeze_backbone`` (linear-probe mode)."""
        self.post_init()
        self.encoder.embedding.zero_pad_rows()
        if self.config.freeze_backbone:
            for p in self.encoder.parameters():
                p.requires_grad_(False)

    @classmethod
    def from_encoder(cls, encoder: TransactionEncoder, **overrides):
        """A model of this class whose encoder starts from ``encoder``'s weights (config: ``encoder``'s,
        as :meth:`TxnHeadConfig.from_config` reads it, with the head's ``overrides`` on top)."""
        model = cls(cls.config_class.from_config(encoder.config, **overrides))
        model.encoder.load_state_dict(encoder.state_dict())
        return model
