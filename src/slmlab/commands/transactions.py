"""``slmlab transactions``: generate a synthetic bank, pretrain the encoder, fine-tune the fraud head,
evaluate it against gradient boosting, score transactions, audit parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

from ._common import command_parser, parse_overrides, split_items

SUBCOMMANDS = ("generate", "pretrain", "finetune", "evaluate", "score", "audit", "demo")


def transactions_command(argv: list[str]) -> int:
    """Transaction encoder: generate | pretrain | finetune | evaluate | score | audit | demo.

    slmlab transactions generate --preset tiny --seed 0 --out data/bank --format parquet
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
    sub = parser.add_subparsers(dest="sub", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    g = sub.add_parser("generate", help="write a synthetic bank")
    g.add_argument("--preset", default="tiny", help="tiny | small | default (configs/synth.yaml)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--out", required=True)
    g.add_argument("--format", default="parquet", choices=("parquet", "csv"))
    g.add_argument("--labels-separate", action="store_true", help="labels in labels.csv, not in transactions")
    g.add_argument("overrides", nargs="*", help="generator settings as key=value (e.g. n_customers=1000)")
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
        if name == "pretrain":
            p.add_argument("--resume", action="store_true", help="continue from the run folder's last checkpoint")
            p.add_argument("--max-transactions", type=int, default=None,
                           help="window length T in transactions (default: the preset's, 16 for lfm2_tiny)")
        if name == "finetune":
            p.add_argument("--encoder", default=None, help="pretrained run folder (default: from scratch)")
            p.add_argument("--linear-probe", action="store_true", help="freeze embedding and backbone")
            p.add_argument("--keep-negative", type=float, default=1.0, help="share of fraud-free windows kept")
            p.add_argument("--fraud-share", type=float, default=0.0,
                           help="repeat fraud windows to about this share of training windows (e.g. 0.5)")
            p.add_argument("--loss", default="bce", choices=("bce", "focal"), help="fraud loss (default bce)")
            p.add_argument("--focal-gamma", type=float, default=2.0, help="focusing exponent of --loss focal")
            p.add_argument("--head-inputs", default="state", choices=("state", "surprisal", "both"),
                           help="fraud head inputs: the state, the pretrained heads' per-field surprisal, or both")
            p.add_argument("--head-hidden", type=int, default=None,
                           help="fraud head MLP width (0: logistic; default D/2 for state, 16 otherwise)")
            p.add_argument("--label-fraction", type=float, default=1.0,
                           help="keep the labels of this seeded random share of training customers (e.g. 0.1)")
            p.add_argument("--head", default="transaction", choices=("transaction", "sequence", "forecast", "customer"),
                           help="transaction fraud (default), window fraud, next-transaction forecast, customer embedding")
            p.add_argument("--recent-k", type=int, default=None,
                           help="--head sequence: label a window by fraud among its K newest transactions")
        if name in ("evaluate", "score"):
            p.add_argument("--model", default=None, help="fine-tuned run folder (evaluate: omit for baselines only)")
            p.add_argument("--out", required=True, help="report folder (evaluate) or CSV file (score)")
        if name == "evaluate":
            p.add_argument("--bootstrap", type=int, default=1000, help="customer resamples for the CIs")
            p.add_argument("--stacking", action="store_true",
                           help="add HGB-rolling + the model's score + 16 PCA components of its customer embedding")
            p.add_argument("--label-fraction", type=float, default=None,
                           help="with --encoder: fine-tune pretrained and from scratch on this share of labels")
            p.add_argument("--encoder", default=None, help="pretrained run folder for --label-fraction")
            p.add_argument("--keep-negative", type=float, default=1.0, help="--label-fraction fine-tuning: as finetune's")
            p.add_argument("items", nargs="*", help="--label-fraction fine-tuning: run-config overrides (max_steps=200)")
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
    return {"generate": _generate, "pretrain": _pretrain, "finetune": _finetune, "evaluate": _evaluate,
            "score": _score, "audit": _audit, "demo": _demo}[args.sub](args)


def _setup(args) -> str:
    import torch

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    from ..train.trainer import resolve_device

    return str(resolve_device(getattr(args, "device", "auto")))


def _generate(args) -> int:
    import time

    from ..transactions.synth import SynthConfig, export, generate

    overrides = parse_overrides(args.overrides)
    if args.seed is not None:
        overrides["seed"] = args.seed
    try:
        cfg = SynthConfig.from_preset(args.preset, **overrides)
    except TypeError as err:
        raise ValueError(f"unknown generator setting ({err}); see configs/synth.yaml for the keys") from None
    t0 = time.perf_counter()
    data = generate(cfg, progress=True)
    seconds = time.perf_counter() - t0
    manifest = export(data, args.out, args.format, args.labels_separate, cfg)
    n = len(data.transactions)
    print(f"{n:,} transactions ({n / seconds:,.0f} rows/s), {len(data.fraud_cases):,} fraud cases,"
          f" fraud rate {manifest['fraud_rate']:.4%} -> {args.out}")
    return 0


def _load_bank(args, schema):
    from ..transactions.data import prepare_bank
    from ..transactions.synth import load_bank

    data = load_bank(args.data)
    return prepare_bank(data.transactions, schema, data.customers, customer_disjoint=args.customer_disjoint)


def _load(path: str, cls):
    from ..train.checkpoint import resolve_checkpoint

    return cls.from_pretrained(str(resolve_checkpoint(path)))


def _pretrain(args) -> int:
    from ..transactions.model import PRESETS, preset_schema
    from ..transactions.training import pretrain

    _setup(args)
    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; use one of {sorted(PRESETS)}")
    files, overrides = split_items(args.items)
    bank = _load_bank(args, preset_schema(args.preset))
    trainer = pretrain(bank, args.preset, args.out, [f"device={args.device}", *overrides], resume=args.resume,
                       files=files, max_transactions=args.max_transactions)
    ev = trainer.state.last_eval
    print(f"pretrained {trainer.state.step} steps; validation CE {ev.get('loss', float('nan')):.4f} -> {args.out}")
    for name in trainer.model.feature_names:
        print(f"  {name:<16} CE {ev[f'ce/{name}']:.3f}  unigram {ev[f'unigram/{name}']:.3f}"
              f"  history {ev[f'history/{name}']:.3f}")
    return 0


def _finetune(args) -> int:
    from ..transactions.model import TransactionEncoder, preset_schema
    from ..transactions.training import finetune

    _setup(args)
    files, overrides = split_items(args.items)
    encoder = _load(args.encoder, TransactionEncoder) if args.encoder else None
    schema = encoder.config.fitted_schema if encoder is not None else preset_schema(args.preset)
    bank = _load_bank(args, schema)
    if args.head != "transaction":
        return _finetune_head(args, bank, encoder, files, overrides)
    trainer = finetune(bank, args.out, encoder, args.preset, [f"device={args.device}", *overrides], args.linear_probe,
                       args.keep_negative, files=files, loss=args.loss, focal_gamma=args.focal_gamma,
                       fraud_share=args.fraud_share, label_fraction=args.label_fraction,
                       head_inputs=args.head_inputs, head_hidden=args.head_hidden)
    ev = trainer.state.last_eval
    print(f"fine-tuned {trainer.state.step} steps; validation PR-AUC {ev.get('pr_auc', float('nan')):.4f} -> {args.out}")
    if trainer.state.best_step >= 0:
        print(f"best validation PR-AUC {trainer.state.best_acc:.4f} at step {trainer.state.best_step}"
              f" -> {Path(args.out, 'checkpoints', 'best')}")
    return 0


def _finetune_head(args, bank, encoder, files, overrides) -> int:
    from ..transactions.training import finetune_head

    trainer = finetune_head(bank, args.out, args.head, encoder, args.preset, [f"device={args.device}", *overrides],
                            args.linear_probe, args.keep_negative, files=files, recent_k=args.recent_k,
                            fraud_share=args.fraud_share)
    ev = trainer.state.last_eval
    print(f"fine-tuned the {args.head} head {trainer.state.step} steps -> {args.out}")
    for key in sorted(ev):
        if isinstance(ev[key], (int, float)):
            print(f"  {key:<34} {ev[key]:.4f}")
    return 0


def _evaluate(args) -> int:
    from ..transactions.evaluate import evaluate_models
    from ..transactions.fraud import TransactionFraudModel
    from ..transactions.model import preset_schema

    device = _setup(args)
    if args.stacking and not args.model:
        raise ValueError("--stacking needs --model; pass a fine-tuned run folder")
    if (args.label_fraction is None) != (args.encoder is None):
        raise ValueError("--label-fraction and --encoder go together; pass both (e.g. --label-fraction 0.1"
                         " --encoder runs/pre) or neither")
    model = _load(args.model, TransactionFraudModel).to(device) if args.model else None
    schema = model.config.fitted_schema if model is not None else preset_schema("lfm2_tiny")
    models, pairs = {}, []
    if args.label_fraction is not None:
        from ..transactions.model import TransactionEncoder
        from ..transactions.training import finetune_label_fraction_pair, label_customers

        label_customers([], args.label_fraction)  # fail before loading anything
        encoder = _load(args.encoder, TransactionEncoder)
        if model is not None and encoder.config.schema != model.config.schema:
            raise ValueError("--encoder and --model hold different fitted schemas; pass the encoder the model was"
                             " fine-tuned from")
        schema = encoder.config.fitted_schema
        files, overrides = split_items(args.items)
        bank = _load_bank(args, schema)
        models = finetune_label_fraction_pair(bank, Path(args.out, "label_fraction"), encoder, args.label_fraction,
                                              [f"device={args.device}", *overrides], args.keep_negative, files=files)
        pairs = [("lf_pretrained", "lf_scratch")]
    else:
        bank = _load_bank(args, schema)
    result = evaluate_models(bank, model, args.out, args.bootstrap, device=device, progress=True,
                             stacking=args.stacking, models=models, pairs=pairs)
    print(Path(args.out, "report.md").read_text())
    return 0 if result else 1


def _score(args) -> int:
    from ..transactions.fraud import TransactionFraudModel
    from ..transactions.score import score_transactions
    from ..transactions.synth import load_bank

    device = _setup(args)
    if not args.model:
        raise ValueError("score needs --model; pass a fine-tuned run folder")
    model = _load(args.model, TransactionFraudModel).to(device)
    data = load_bank(args.data)
    out = score_transactions(model, data.transactions, data.customers, device=device)
    out.to_csv(args.out, index=False)
    print(f"scored {len(out):,} transactions -> {args.out}")
    return 0


def _audit(args) -> int:
    import torch

    from ..transactions.model import TransactionEncoder, TxnEncoderConfig

    with torch.device("meta"):
        model = TransactionEncoder(TxnEncoderConfig.from_preset(args.preset))
    print(json.dumps({"preset": args.preset, **model.param_count()}, indent=1))
    return 0


def _demo(args) -> int:
    import tempfile

    from ..transactions.demo import load_state, quick_state
    from ..transactions.demo_app import check_port, launch

    _setup(args)
    from threadpoolctl import threadpool_limits

    # the demo's gradient-boosting fits are small; a full OpenMP pool on busy cores stalls them for minutes
    threadpool_limits(args.threads or 1)
    check_port(args.host, args.port)  # before minutes of training
    if args.quick:
        work = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="slmlab-demo-"))
        state = quick_state(work)
        t = state.timings
        print(f"quick: generated the tiny bank in {t['generate_s']:.1f} s, trained lfm2_tiny in {t['train_s']:.1f} s"
              f" (baselines and threshold {t['state_s']:.1f} s) -> {work}", flush=True)
    else:
        if not args.data:
            raise ValueError("--checkpoint needs --data, the bank folder the demo shows")
        state = load_state(args.checkpoint, args.data)
    print(f"demo on http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    launch(state, args.host, args.port)
    return 0
