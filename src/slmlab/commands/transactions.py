"""``slmlab transactions``: generate a synthetic bank, pretrain the encoder, fine-tune the fraud head,
evaluate it against gradient boosting, score transactions, audit parameter counts, serve the demo.

This module parses arguments and prints; each subcommand is one call of
:mod:`slmlab.transactions.pipeline`. Nothing heavy is imported before the arguments parse.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..outputs import dumps_finite
from ._common import command_parser, parse_overrides, split_items
from .errors import EXIT_USAGE

SUBCOMMANDS = ("generate", "subset", "pretrain", "finetune", "evaluate", "score", "audit", "demo")


class HeadNames:
    """The ``--head`` choices: the names of the head table :data:`slmlab.transactions.heads.HEADS`,
    read on first use (a value to check, the subcommand's help), so building the parser imports no
    torch."""

    @staticmethod
    def _names() -> tuple[str, ...]:
        from ..transactions.heads import HEADS

        return tuple(HEADS)

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser with options added when that subcommand is parsed (``deferred``: callables
    taking the parser), so that options read from the head table import torch only then, never while
    the parser is built."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deferred: list = []

    def parse_known_args(self, args=None, namespace=None):
        while self.deferred:
            self.deferred.pop(0)(self)
        return super().parse_known_args(args, namespace)


def _add_head_flags(parser: argparse.ArgumentParser) -> None:
    """``finetune``'s head options: every head's :class:`~slmlab.transactions.heads.HeadFlag` rows."""
    from ..transactions.heads import HEAD_FLAGS

    for flag in HEAD_FLAGS:
        flag.add_to(parser)


def transactions_command(argv: list[str]) -> int:
    """Transaction encoder: generate | subset | pretrain | finetune | evaluate | score | audit | demo.

    slmlab transactions generate --preset tiny --seed 0 --out data/bank --format parquet
    slmlab transactions subset --data data/bank --customers :500 --out data/bank-500
    slmlab transactions pretrain --data data/bank --preset lfm2_tiny --out runs/txn max_steps=200
    slmlab transactions finetune --data data/bank --encoder runs/txn --out runs/txn-fraud max_steps=200
    slmlab transactions evaluate --data data/bank --model runs/txn-fraud --out reports/txn
    slmlab transactions score --data data/bank --model runs/txn-fraud --out scores.csv
    slmlab transactions audit --preset lfm2_small
    slmlab transactions demo --quick   (or --checkpoint runs/txn-fraud --data data/bank)
    Trailing key=value words are run-config overrides, as for `slmlab train` (e.g. max_steps=3).
    See docs/transactions.md.
    """

    parser = command_parser(transactions_command, "transactions")
    sub = parser.add_subparsers(dest="sub", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}",
                                parser_class=_Subcommand)
    g = sub.add_parser("generate", help="write a synthetic bank")
    g.add_argument("--preset", default="tiny", help="tiny | small | default | large (configs/synth.yaml)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--out", required=True)
    g.add_argument("--format", default="parquet", choices=("parquet", "csv"))
    g.add_argument("--labels-separate", action="store_true", help="labels in labels.csv, not in transactions")
    g.add_argument("--force", action="store_true", help="overwrite the files of a non-empty --out")
    g.add_argument("overrides", nargs="*", help="generator settings as key=value (e.g. n_customers=1000)")
    c = sub.add_parser("subset", help="write the bank of a slice of the customers")
    c.add_argument("--data", required=True, help="the bank folder to read")
    c.add_argument("--customers", required=True, metavar="START:STOP",
                   help="positions in the sorted customer ids, e.g. :6500 (the first 6,500) or 6500: (the rest)")
    c.add_argument("--out", required=True)
    c.add_argument("--force", action="store_true", help="overwrite the files of a non-empty --out")
    for name in ("pretrain", "finetune", "evaluate", "score"):
        p = sub.add_parser(name)
        p.add_argument("--data", required=True, help="a bank folder (generate's --out, or a mapped real export)")
        p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
        p.add_argument("--device", default="auto")
        p.add_argument("--customer-disjoint", action="store_true", help="also hold out 20%% of customers")
        if name in ("pretrain", "finetune"):
            p.add_argument("--out", required=True, help="run folder")
            p.add_argument("--preset", default="lfm2_tiny", help="lfm2_tiny | lfm2_small")
            p.add_argument("items", nargs="*", help="run-config YAML files and key=value overrides")
        if name in ("pretrain", "finetune"):
            p.add_argument("--resume", action="store_true",
                           help="continue from the run folder's last checkpoint (same seed, bank and model settings)")
            p.add_argument("--allow-change", metavar="FIELD", action="append", default=[],
                           help="with --resume, accept a change of this protected field (seed, data, ...); repeatable")
            p.add_argument("--val-windows", type=_positive_int, default=None, metavar="N",
                           help="validate on a seeded sample of N validation windows (default: all; a large bank's"
                                " validation period costs minutes of CPU per pass)")
        if name == "pretrain":
            p.add_argument("--max-transactions", type=int, default=None,
                           help="window length T in transactions (default: the preset's, 16 for lfm2_tiny)")
        if name == "finetune":
            p.add_argument("--encoder", default=None, help="pretrained run folder (default: from scratch)")
            p.add_argument("--linear-probe", action="store_true", help="freeze embedding and backbone")
            p.add_argument("--keep-negative", type=float, default=1.0, help="share of fraud-free windows kept")
            p.add_argument("--fraud-share", type=float, default=0.0,
                           help="repeat fraud windows to about this share of training windows (e.g. 0.5)")
            p.add_argument("--label-fraction", type=float, default=1.0,
                           help="keep the labels of this seeded random share of training customers (e.g. 0.1)")
            p.add_argument("--head", default="transaction", choices=HeadNames(), metavar="HEAD",
                           help="the head to fine-tune, one of %(choices)s (slmlab.transactions.heads.HEADS): "
                                "transaction fraud (default), window fraud, next-transaction forecast, customer embedding")
            p.deferred.append(_add_head_flags)  # each head's own options, from the head table
        if name in ("evaluate", "score"):
            p.add_argument("--model", default=None, help="fine-tuned run folder (evaluate: omit for baselines only)")
            p.add_argument("--out", required=True, help="report folder (evaluate) or CSV file (score)")
        if name == "evaluate":
            p.add_argument("--bootstrap", type=int, default=1000, help="customer resamples for the CIs")
            p.add_argument("--encoder", default=None,
                           help="pretrained run folder: adds hgb_rolling_encoder (HGB-rolling plus the frozen"
                                " encoder's state); with --label-fraction, the encoder the pretrained arm starts from")
            p.add_argument("--primary", default=None, action=_Checked, check=_primary, metavar="NAME",
                           help="criterion 2's one pre-declared comparison against hgb_rolling, one of"
                                f" {', '.join(PRIMARY_CHOICES)} (default: stacked with --model, else"
                                " hgb_rolling_encoder); the other fused models are shown, not counted")
            p.add_argument("--label-fraction", type=float, default=None,
                           help="with --encoder: fine-tune pretrained and from scratch on this share of labels"
                                " (criterion 4)")
            p.add_argument("--seeds", default=None, action=_Checked, check=_seed_count, metavar="N",
                           help=f"--label-fraction: fine-tunes per arm, seeds 0..N-1 (default {DEFAULT_SEEDS};"
                                f" criterion 4's CI holds the seed variance from {DEFAULT_SEEDS} seeds up)")
            p.add_argument("--keep-negative", type=float, default=1.0, help="--label-fraction fine-tuning: as finetune's")
            p.add_argument("items", nargs="*", help="--label-fraction fine-tuning: run-config overrides (max_steps=200)")
            p.add_argument("--also", metavar="NAME=RUN", action="append", default=[],
                           help="another fine-tuned run folder to report, e.g. joint=runs/ftj (one fine-tuned with"
                                " --tabular rolling is a stacker input and a secondary comparison of criterion 2);"
                                " repeatable")
            p.add_argument("--val-windows", type=_positive_int, default=None, metavar="N",
                           help="--label-fraction fine-tuning: validate on a seeded sample of N windows")
            p.add_argument("--cache", default=None, metavar="DIR",
                           help="keep the gradient-boosting scores (and hgb_rolling_encoder's, per encoder) here and reuse"
                                " them for the same bank")
            for flag, why in REMOVED_EVALUATE_FLAGS.items():
                p.add_argument(flag, nargs="?", action=_Removed, why=why)
    a = sub.add_parser("audit", help="print param_count() of a preset")
    a.add_argument("--preset", default="lfm2_small")
    d = sub.add_parser("demo", help="the six-tab Gradio demo on 127.0.0.1 (extra `demo`)")
    which = d.add_mutually_exclusive_group(required=True)
    which.add_argument("--quick", action="store_true", help="generate the tiny bank and train lfm2_tiny first")
    which.add_argument("--checkpoint", default=None, help="fine-tuned run folder holding schema.fitted.json")
    d.add_argument("--data", default=None, help="bank folder (with --checkpoint; with --quick: where to write it)")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=7860)
    d.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0 = torch's default) and gradient boosting's (0 = 1)")
    args = parser.parse_args(argv)
    return {"generate": _generate, "subset": _subset, "pretrain": _pretrain, "finetune": _finetune, "evaluate": _evaluate,
            "score": _score, "audit": _audit, "demo": _demo}[args.sub](args)


PRIMARY_CHOICES = ("stacked", "hgb_rolling_encoder")  # criterion 2's primary (fused kinds: evaluation.kinds)
DEFAULT_SEEDS = 3  # criterion 4: fine-tunes per arm
REMOVED_EVALUATE_FLAGS = {
    "--stacking": "the stacker is now always the out-of-fold blend (docs/transactions.md)",
    "--stack-fit": "the stacker is now always the out-of-fold blend, fitted on validation (docs/transactions.md)",
}


def _usage_error(parser: argparse.ArgumentParser, message: str):
    """The error contract (:mod:`.errors`) for an argument: one line, ``slmlab transactions <sub>: error:
    <what>; <what to do>``, exit 2 (argparse's own errors add a usage line first)."""
    parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message}\n")


class _Removed(argparse.Action):
    """A removed flag: an error saying so and what replaced it, not argparse's "unrecognized arguments"
    (and never silently accepted). Hidden from ``--help``."""

    def __init__(self, option_strings, dest, why: str, **kwargs):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        _usage_error(parser, f"{self.option_strings[0]} was removed; {self.why}; drop the flag")


class _Checked(argparse.Action):
    """An option whose value ``check`` converts, or rejects with a ``ValueError`` naming the value and
    the choices: one-line error, exit 2 (:func:`_usage_error`)."""

    def __init__(self, option_strings, dest, check, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.check = check

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, self.check(values))
        except ValueError as err:
            _usage_error(parser, f"{option_string} {values!r}: {err}")


def _primary(text: str) -> str:
    if text not in PRIMARY_CHOICES:
        raise ValueError(f"not a primary comparison; choose one of {', '.join(PRIMARY_CHOICES)}")
    return text


def _seed_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"not a seed count; give a whole number >= 1 (default {DEFAULT_SEEDS})")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _common(args) -> dict:
    """The options every bank subcommand shares, as :mod:`slmlab.transactions.pipeline` takes them."""
    return {"device": args.device, "threads": args.threads, "customer_disjoint": args.customer_disjoint}


def _generate(args) -> int:
    from ..transactions import pipeline

    run = pipeline.generate_bank(args.out, args.preset, args.seed, args.format, args.labels_separate,
                                 parse_overrides(args.overrides), force=args.force)
    n = len(run.data.transactions)
    print(f"{n:,} transactions ({n / run.seconds:,.0f} rows/s), {len(run.data.fraud_cases):,} fraud cases,"
          f" fraud rate {run.manifest['fraud_rate']:.4%} -> {args.out}")
    return 0


def _subset(args) -> int:
    from ..transactions import pipeline

    run = pipeline.subset_bank(args.data, args.out, args.customers, force=args.force)
    n = len(run.data.transactions)
    print(f"{run.manifest['subset']['n_customers']:,} customers, {n:,} transactions,"
          f" {len(run.data.fraud_cases):,} fraud cases -> {args.out}")
    return 0


def _pretrain(args) -> int:
    from ..transactions import pipeline

    files, overrides = split_items(args.items)
    trainer = pipeline.pretrain(args.data, args.out, args.preset, files, overrides, resume=args.resume,
                                allow_change=tuple(args.allow_change), max_transactions=args.max_transactions,
                                val_windows=args.val_windows, **_common(args))
    print("\n".join(pipeline.pretrain_summary(trainer, args.out)))
    return pipeline.exit_status(trainer)


def _finetune(args) -> int:
    from ..transactions import pipeline
    from ..transactions.heads import HEAD_FLAGS

    files, overrides = split_items(args.items)
    names = ("keep_negative", "fraud_share", "label_fraction", *(flag.option for flag in HEAD_FLAGS))
    options = {name: getattr(args, name) for name in names}
    trainer = pipeline.finetune(args.data, args.out, args.encoder, args.preset, files, overrides, head=args.head,
                                linear_probe=args.linear_probe, resume=args.resume,
                                allow_change=tuple(args.allow_change), val_windows=args.val_windows,
                                **_common(args), **options)
    print("\n".join(pipeline.finetune_summary(trainer, args.head, args.out)))
    return pipeline.exit_status(trainer)


def _evaluate(args) -> int:
    from ..transactions import pipeline

    files, overrides = split_items(args.items) if args.label_fraction is not None else ([], [])
    also = {}
    for item in args.also:
        name, sep, path = item.partition("=")
        if not sep or not name or not path or name in also:
            raise ValueError(f"--also takes NAME=RUN with a new name (e.g. joint=runs/ftj), got {item!r}")
        also[name] = path
    result = pipeline.evaluate(args.data, args.out, args.model, args.bootstrap, label_fraction=args.label_fraction,
                               encoder=args.encoder, keep_negative=args.keep_negative, files=files, overrides=overrides,
                               also=also, cache=args.cache, val_windows=args.val_windows, seeds=args.seeds,
                               primary=args.primary, **_common(args))
    print(Path(args.out, "report.md").read_text())
    return 0 if result else 1


def _score(args) -> int:
    from ..transactions import pipeline

    table = pipeline.score(args.data, args.out, args.model, args.device, args.threads)
    print(f"scored {len(table):,} transactions -> {args.out}")
    return 0


def _audit(args) -> int:
    from ..transactions import pipeline

    print(dumps_finite(pipeline.audit(args.preset), indent=1))
    return 0


def _demo(args) -> int:
    from ..transactions import pipeline

    pipeline.demo(args.quick, args.checkpoint, args.data, args.host, args.port, args.threads,
                  log=lambda line: print(line, flush=True))
    return 0
