"""The one table of fine-tuning heads: :data:`HEADS`, ``name -> HeadSpec``.

A :class:`HeadSpec` says everything fine-tuning, the CLI and the tests need about a head: its model
class (whose ``config_class`` holds the head's own config fields), how a batch's labels are made, which
windows it trains and validates on (and the config values those fix, e.g. ``pos_weight``), how it is
evaluated, and which of the ``finetune`` command's options apply to it. ``slmlab transactions finetune
--head`` offers exactly the names of this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..data.bank import Bank
from ..data.windows import WindowOptions, Windows
from ..model import TxnHeadConfig, TxnHeadModel
from . import customer, forecast, fraud, sequence

# ``(ids [B, T, F], txn_mask [B, T], row labels [B, T] int64, config) -> batch labels``
HeadLabels = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, TxnHeadConfig], torch.Tensor]
# ``(bank, T, window options, head config values) -> ({"train": ..., "validation": ...}, config values)``
HeadWindows = Callable[[Bank, int, WindowOptions, dict], tuple[dict[str, Windows], dict]]
# ``(model, validation windows, batch size) -> metrics`` (``loss``; ``acc`` is what ``keep_best`` selects on)
HeadEvaluate = Callable[[TxnHeadModel, Windows, int], dict]


@dataclass(frozen=True)
class HeadSpec:
    """One fine-tuning head.

    Attributes:
        name: the ``--head`` choice.
        model_class: the :class:`~slmlab.transactions.model.TxnHeadModel` subclass.
        labels: how a batch's labels are made from its windows (:data:`HeadLabels`).
        windows: its training / validation windows and the config values they fix (:data:`HeadWindows`).
        evaluate: its validation metrics (:data:`HeadEvaluate`).
        data_options: which of :class:`~slmlab.transactions.data.windows.WindowOptions`' fields apply.
        cli_options: ``finetune`` option (argparse name) -> the head config field it sets.
    """

    name: str
    model_class: type[TxnHeadModel]
    labels: HeadLabels
    windows: HeadWindows
    evaluate: HeadEvaluate
    data_options: tuple[str, ...] = ()
    cli_options: dict[str, str] = field(default_factory=dict)

    @property
    def config_class(self) -> type[TxnHeadConfig]:
        return self.model_class.config_class

    @property
    def config_fields(self) -> tuple[str, ...]:
        """The head's own config fields (besides ``freeze_backbone``, which every head has)."""
        return self.config_class.HEAD_FIELDS


HEADS: dict[str, HeadSpec] = {spec.name: spec for spec in (
    HeadSpec("transaction", fraud.TransactionFraudModel, labels=fraud.transaction_labels,
             windows=fraud.training_windows, evaluate=fraud.fraud_eval,
             data_options=("keep_negative", "fraud_share", "label_fraction", "seed"),
             cli_options={"loss": "fraud_loss", "focal_gamma": "focal_gamma", "head_inputs": "fraud_head_inputs",
                          "head_hidden": "fraud_hidden", "tabular": "fraud_tabular", "head_dropout": "fraud_dropout"}),
    HeadSpec("sequence", sequence.SequenceFraudModel, labels=sequence.sequence_labels,
             windows=sequence.training_windows, evaluate=sequence.sequence_eval,
             data_options=("keep_negative", "fraud_share", "seed"), cli_options={"recent_k": "sequence_recent_k"}),
    HeadSpec("forecast", forecast.NextTransactionModel, labels=forecast.forecast_labels,
             windows=forecast.training_windows, evaluate=forecast.forecast_eval),
    HeadSpec("customer", customer.CustomerEmbeddingModel, labels=customer.pair_labels,
             windows=customer.training_windows, evaluate=customer.customer_eval),
)}


def head_spec(name: str) -> HeadSpec:
    """The spec of head ``name``; ``ValueError`` naming the heads when there is none."""
    if name not in HEADS:
        raise ValueError(f"unknown head {name!r}; use one of {', '.join(HEADS)}")
    return HEADS[name]
