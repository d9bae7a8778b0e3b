"""Transaction sequences: schema, synthetic bank, structured embedding, per-feature LM heads, the
LFM2 transaction encoder, the fraud head and the evaluation against gradient boosting
(docs/transactions.md). Needs the ``transactions`` extra (pandas, pyarrow, scikit-learn).
"""

from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

from . import _deps  # noqa: F401  (raises an ImportError naming the extra)
from .customer import CustomerEmbeddingHead, CustomerEmbeddingModel, embed_windows, info_nce
from .embedding import StructuredEmbedding
from .forecast import NextTransactionHead, NextTransactionModel
from .fraud import TransactionFraudHead, TransactionFraudModel
from .generate import NextTransactions, generate_next_transaction, next_transaction_topk
from .heads import PerFeatureLMHeads
from .model import PRESETS, TransactionEncoder, TxnEncoderConfig
from .schema import FittedSchema, SchemaConfig, load_schema
from .sequence import SequenceFraudHead, SequenceFraudModel
from .windows import Windows, build_windows

AutoConfig.register(TxnEncoderConfig.model_type, TxnEncoderConfig, exist_ok=True)
AutoModel.register(TxnEncoderConfig, TransactionEncoder, exist_ok=True)
AutoModelForTokenClassification.register(TxnEncoderConfig, TransactionFraudModel, exist_ok=True)

__all__ = [
    "PRESETS",
    "CustomerEmbeddingHead",
    "CustomerEmbeddingModel",
    "FittedSchema",
    "NextTransactionHead",
    "NextTransactionModel",
    "NextTransactions",
    "PerFeatureLMHeads",
    "SchemaConfig",
    "SequenceFraudHead",
    "SequenceFraudModel",
    "StructuredEmbedding",
    "TransactionEncoder",
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
