"""Transaction sequences: schema, synthetic bank, structured embedding, per-feature LM heads, the
LFM2 transaction encoder, the fraud head and the evaluation against gradient boosting
(docs/transactions.md). Needs the ``transactions`` extra (pandas, pyarrow, scikit-learn).
"""

from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

from . import _deps  # noqa: F401  (raises an ImportError naming the extra)
from .embedding import StructuredEmbedding
from .fraud import TransactionFraudHead, TransactionFraudModel
from .heads import PerFeatureLMHeads
from .model import PRESETS, TransactionEncoder, TxnEncoderConfig
from .schema import FittedSchema, SchemaConfig, load_schema
from .windows import Windows, build_windows

AutoConfig.register(TxnEncoderConfig.model_type, TxnEncoderConfig, exist_ok=True)
AutoModel.register(TxnEncoderConfig, TransactionEncoder, exist_ok=True)
AutoModelForTokenClassification.register(TxnEncoderConfig, TransactionFraudModel, exist_ok=True)

__all__ = [
    "PRESETS",
    "FittedSchema",
    "PerFeatureLMHeads",
    "SchemaConfig",
    "StructuredEmbedding",
    "TransactionEncoder",
    "TransactionFraudHead",
    "TransactionFraudModel",
    "TxnEncoderConfig",
    "Windows",
    "build_windows",
    "load_schema",
]
