"""Transaction sequences: schema, synthetic bank, structured embedding, per-feature LM heads, the
LFM2 transaction encoder, the fine-tuned heads and the evaluation against gradient boosting
(docs/transactions.md). Needs the ``transactions`` extra (pandas, pyarrow, scikit-learn).

Layout (imports point down, never up; ``tests/transactions/test_transactions_imports.py`` checks it):

- ``data/``: schema, synthetic generator, column-map adapter, bank folders and the encoded bank, windows;
- ``embedding.py``, ``model.py``: the encoder (and the base of the fine-tuned models);
- ``heads/``: the fine-tuned heads and :data:`~slmlab.transactions.heads.HEADS`, the table of them;
  ``generate.py``: next-transaction generation from the pretrained heads;
- ``evaluation/``: baseline, streaming scorer, stacking, report; ``training.py``: the harness runs;
- ``pipeline.py``: one function per ``slmlab transactions`` subcommand; ``demo/``: the Gradio demo.
"""

from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

from . import _deps  # noqa: F401  (raises an ImportError naming the extra)
from .data.schema import FittedSchema, SchemaConfig, load_schema
from .data.windows import Windows, build_windows
from .embedding import PerFeatureLMHeads, StructuredEmbedding
from .generate import NextTransactions, generate_next_transaction, next_transaction_topk
from .heads import (
    HEADS,
    CustomerEmbeddingConfig,
    CustomerEmbeddingHead,
    CustomerEmbeddingModel,
    HeadSpec,
    NextTransactionConfig,
    NextTransactionHead,
    NextTransactionModel,
    SequenceFraudConfig,
    SequenceFraudHead,
    SequenceFraudModel,
    TransactionFraudConfig,
    TransactionFraudHead,
    TransactionFraudModel,
    embed_windows,
    info_nce,
)
from .model import PRESETS, TransactionEncoder, TxnEncoderConfig

AutoConfig.register(TxnEncoderConfig.model_type, TxnEncoderConfig, exist_ok=True)
AutoModel.register(TxnEncoderConfig, TransactionEncoder, exist_ok=True)
for _spec in HEADS.values():
    AutoConfig.register(_spec.config_class.model_type, _spec.config_class, exist_ok=True)
AutoModelForTokenClassification.register(TransactionFraudConfig, TransactionFraudModel, exist_ok=True)

__all__ = [
    "HEADS",
    "PRESETS",
    "CustomerEmbeddingConfig",
    "CustomerEmbeddingHead",
    "CustomerEmbeddingModel",
    "FittedSchema",
    "HeadSpec",
    "NextTransactionConfig",
    "NextTransactionHead",
    "NextTransactionModel",
    "NextTransactions",
    "PerFeatureLMHeads",
    "SchemaConfig",
    "SequenceFraudConfig",
    "SequenceFraudHead",
    "SequenceFraudModel",
    "StructuredEmbedding",
    "TransactionEncoder",
    "TransactionFraudConfig",
    "TransactionFraudHead",
    "TransactionFraudModel",
    "TxnEncoderConfig",
    "Windows",
    "build_windows",
    "embed_windows",
    "generate_next_transaction",
    "info_nce",
    "load_schema",
    "next_transaction_topk",
]
