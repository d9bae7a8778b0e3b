"""The heads wing of :mod:`slmlab.transactions`: the fine-tuned models on the encoder, one module each,
and :data:`HEADS`, the one table of them (:mod:`.spec`), whose rows also declare each head's ``finetune``
options (:class:`HeadFlag`, all of them :data:`HEAD_FLAGS`).

- :mod:`.fraud`: per-transaction fraud (``transaction``), its losses and config;
- :mod:`.surprisal`: the pretrained heads' per-field surprisal as fraud-head inputs;
- :mod:`.sequence`: window-level fraud (``sequence``);
- :mod:`.forecast`: next-transaction forecast (``forecast``);
- :mod:`.customer`: customer embeddings with InfoNCE (``customer``);
- :mod:`.joint`: the joint-fusion fraud head (``transaction`` with ``--tabular rolling``).

Imports point down: heads read :mod:`slmlab.transactions.model` and the data wing, never evaluation,
training or the demo.
"""

from .customer import CustomerEmbeddingConfig, CustomerEmbeddingHead, CustomerEmbeddingModel, embed_windows, info_nce
from .forecast import NextTransactionConfig, NextTransactionHead, NextTransactionModel
from .fraud import TransactionFraudConfig, TransactionFraudHead, TransactionFraudModel
from .sequence import SequenceFraudConfig, SequenceFraudHead, SequenceFraudModel
from .spec import HEAD_FLAGS, HEADS, HeadFlag, HeadSpec, head_spec
from .surprisal import SurprisalFraudHead

__all__ = [
    "HEADS",
    "HEAD_FLAGS",
    "CustomerEmbeddingConfig",
    "CustomerEmbeddingHead",
    "CustomerEmbeddingModel",
    "HeadFlag",
    "HeadSpec",
    "NextTransactionConfig",
    "NextTransactionHead",
    "NextTransactionModel",
    "SequenceFraudConfig",
    "SequenceFraudHead",
    "SequenceFraudModel",
    "SurprisalFraudHead",
    "TransactionFraudConfig",
    "TransactionFraudHead",
    "TransactionFraudModel",
    "embed_windows",
    "head_spec",
    "info_nce",
]
