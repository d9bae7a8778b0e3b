"""The one table of fine-tuning heads: :data:`HEADS`, ``name -> HeadSpec``.

A :class:`HeadSpec` says everything fine-tuning, the CLI and the tests need about a head: its model
class (whose ``config_class`` holds the head's own config fields), how a batch's labels are made, which
windows it trains and validates on (and the config values those fix, e.g. ``pos_weight``), how it is
evaluated, and the ``finetune`` command's options that set its config (:class:`HeadFlag` rows, from which
the command builds those options). ``slmlab transactions finetune --head`` offers exactly the names of
this table; a new head, with its options, is one row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..data.bank import Bank
from ..data.windows import WindowOptions, Windows
from ..model import TxnHeadConfig, TxnHeadModel
from . import customer, forecast, fraud, sequence

# ``(ids [B, T, F], txn_mask [B, T], row labels [B, T] int64, config) -> batch labels``
HeadLabels = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, TxnHeadConfig], torch.Tensor]
# ``(bank, T, window options, head config values) -> ({"train": ..., "validation": ...}, config values)``
HeadWindows = Callable[[Bank, int, WindowOptions, dict], tuple[dict[str, Windows], dict]]
# ``(new model, bank, window options) -> what it did`` (a fresh fine-tune, before its first step)
HeadInitialise = Callable[[TxnHeadModel, Bank, WindowOptions], dict]
# ``(model, validation windows, batch size) -> metrics`` (``loss``; ``acc`` is what ``keep_best`` selects on)
HeadEvaluate = Callable[[TxnHeadModel, Windows, int], dict]


@dataclass(frozen=True)
class HeadFlag:
    """A ``slmlab transactions finetune`` option that sets a field of one head's config.

    Attributes:
        option: the option's name as argparse stores it (``head_inputs`` is ``--head-inputs``).
        field: the head config field it sets.
        help: its ``--help`` line.
        type, default, choices: as ``argparse.ArgumentParser.add_argument`` takes them.
        omit_default: the field reaches the head config (and the run's recorded identity) only when set
            to another value than ``default``: a row added after run folders were written, so that
            those folders resume and re-record unchanged.
    """

    option: str
    field: str
    help: str
    type: Callable[[str], object] | None = None
    default: object = None
    choices: tuple[str, ...] | None = None
    omit_default: bool = False

    @property
    def flag(self) -> str:
        """The command-line spelling, ``--head-inputs``."""
        return "--" + self.option.replace("_", "-")

    def add_to(self, parser) -> None:
        """Add the option to an ``argparse`` parser."""
        parser.add_argument(self.flag, type=self.type, default=self.default, choices=self.choices, help=self.help)


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
        flags: the ``finetune`` options that set this head's config fields (:class:`HeadFlag`).
        initialise: what a fresh fine-tune does to the new model before its first step, from the bank
            (:data:`HeadInitialise`; e.g. the wide term's warm start); None: nothing.
    """

    name: str
    model_class: type[TxnHeadModel]
    labels: HeadLabels
    windows: HeadWindows
    evaluate: HeadEvaluate
    data_options: tuple[str, ...] = ()
    flags: tuple[HeadFlag, ...] = ()
    initialise: HeadInitialise | None = None

    @property
    def config_class(self) -> type[TxnHeadConfig]:
        return self.model_class.config_class

    def head_config(self, options: dict) -> dict:
        """The head config fields ``finetune``'s ``options`` (argparse names) set (an ``omit_default`` row at
        its default sets nothing)."""
        return {flag.field: options[flag.option] for flag in self.flags if flag.option in options
                and not (flag.omit_default and options[flag.option] == flag.default)}

    @property
    def cli_options(self) -> dict[str, str]:
        """``finetune`` option (argparse name) -> the head config field it sets."""
        return {flag.option: flag.field for flag in self.flags}

    @property
    def config_fields(self) -> tuple[str, ...]:
        """The head's own config fields (besides ``freeze_backbone``, which every head has)."""
        return self.config_class.HEAD_FIELDS


HEADS: dict[str, HeadSpec] = {spec.name: spec for spec in (
    HeadSpec("transaction", fraud.TransactionFraudModel, labels=fraud.transaction_labels,
             windows=fraud.training_windows, evaluate=fraud.fraud_eval,
             data_options=("keep_negative", "fraud_share", "label_fraction", "seed"), flags=(
                 # in the order run.yaml records them (run folders written before the rows stay byte-identical)
                 HeadFlag("loss", "fraud_loss", "fraud loss (default bce)", default="bce",
                          choices=fraud.FRAUD_LOSSES),
                 HeadFlag("focal_gamma", "focal_gamma", "focusing exponent of --loss focal", float, 2.0),
                 HeadFlag("head_inputs", "fraud_head_inputs", "fraud head inputs: the state, the pretrained heads'"
                          " per-field surprisal, or both", default="state", choices=fraud.HEAD_INPUTS),
                 HeadFlag("head_hidden", "fraud_hidden", "fraud head MLP width (0: logistic; default D/2 for state,"
                          " 16 otherwise)", int),
                 HeadFlag("tabular", "fraud_tabular", "joint fusion: the fraud head also reads each transaction's"
                          " rolling features (the HGB-rolling baseline's, from earlier rows only), trained end to"
                          " end", default="none", choices=fraud.TABULAR_CHOICES),
                 HeadFlag("head_dropout", "fraud_dropout", "dropout of the fraud head MLP (default 0.1)", float, 0.1),
                 HeadFlag("wide", "fraud_wide", "wide & deep: add a linear term on the transaction's own field"
                          " tokens, started from the per-row logistic regression (token_lr) fitted on the training"
                          " rows, the deep head's output starting at 0", default="none", choices=fraud.WIDE_CHOICES,
                          omit_default=True)),
             initialise=fraud.warm_start),
    HeadSpec("sequence", sequence.SequenceFraudModel, labels=sequence.sequence_labels,
             windows=sequence.training_windows, evaluate=sequence.sequence_eval,
             data_options=("keep_negative", "fraud_share", "seed"), flags=(
                 HeadFlag("recent_k", "sequence_recent_k", "--head sequence: label a window by fraud among its K"
                          " newest transactions", int),)),
    HeadSpec("forecast", forecast.NextTransactionModel, labels=forecast.forecast_labels,
             windows=forecast.training_windows, evaluate=forecast.forecast_eval),
    HeadSpec("customer", customer.CustomerEmbeddingModel, labels=customer.pair_labels,
             windows=customer.training_windows, evaluate=customer.customer_eval),
)}
# every head's flags, in table order (an option belongs to one head)
HEAD_FLAGS: tuple[HeadFlag, ...] = tuple(flag for spec in HEADS.values() for flag in spec.flags)


def head_spec(name: str) -> HeadSpec:
    """The spec of head ``name``; ``ValueError`` naming the heads when there is none."""
    if name not in HEADS:
        raise ValueError(f"unknown head {name!r}; use one of {', '.join(HEADS)}")
    return HEADS[name]
