"""The evaluation wing of :mod:`slmlab.transactions`: the gradient-boosting baseline and its shared
train/validation split and scoring (:mod:`.baseline`), the streaming scorer (:mod:`.score`), the
stacked model (:mod:`.stacking`), the test-period report against the baselines (:mod:`.evaluate`) and
the pretraining validation report (:mod:`.pretrain`). Imports point down: ``evaluate`` and
``stacking`` both read ``baseline``; nothing here reads training, the pipeline or the demo.
"""

from .evaluate import evaluate_models, usefulness_criteria
from .score import score_bank, score_embed_bank, score_transactions

__all__ = ["evaluate_models", "score_bank", "score_embed_bank", "score_transactions", "usefulness_criteria"]
