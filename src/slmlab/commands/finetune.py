"""``slmlab finetune``: argument parsing only; the run is built by :mod:`slmlab.train.finetune` and trained by
the same :class:`~slmlab.train.trainer.Trainer` as ``slmlab train``."""

from __future__ import annotations

from ._common import add_run_arguments, command_parser, run_overrides, split_items


def finetune_command(argv: list[str]) -> int:
    """Fine-tune a saved model on chat data, fully or with LoRA adapters (see docs/finetune.md).

    Examples:
      slmlab finetune runs/quickstart --data builtin:chat --lora r=8,alpha=16 --out runs/qs-lora
      slmlab finetune runs/quickstart --data chat.jsonl --out runs/qs-full max_steps=500 optim.lr=1e-4
      slmlab finetune runs/qs-lora --data builtin:chat --lora r=8,alpha=16 --out runs/qs-lora --resume
      slmlab finetune runs/qs-lora --merge --out runs/qs-merged      # an adapter run -> a plain checkpoint
      slmlab finetune --make-data chat.jsonl                         # the shipped builtin:chat set as a file
      slmlab finetune runs/qs-lora --data builtin:chat --eval-only   # held-out assistant-token loss
    Data: a .jsonl file, one {"messages": [{"role", "content"}, ...]} or {"prompt", "completion"} per line, or
    builtin:chat (4,000 made-in-code conversations: arithmetic, capitals, echo, reverse). The loss is on the
    assistant's tokens only; every tenth conversation is held out, and the validation loss is on its assistant
    tokens. The chat template is the tokenizer's chat_template, or slmlab's plain "User: ...\\nAssistant:" one.
    --lora [r=8,alpha=16,dropout=0,targets=q_proj,v_proj]: train only LoRA adapters (peft; default targets: the
    family's LORA_TARGETS); checkpoints are then adapter folders that eval, generate, chat, serve and export load
    merged into their base. --merge also writes OUT/merged, a plain checkpoint (replacing an earlier merge of the
    run); without --data, --merge --out DIR writes RUN merged into DIR, which must be new or empty.
    Defaults that differ from slmlab train: max_steps=300, eval_every=100, checkpoint_every=100, eval_batches=0
    (the whole held-out split), optim.lr=3e-4 (2e-3 with --lora), optim.weight_decay=0, schedule.warmup=0.1,
    block_size = the context the model was trained on, out_dir = RUN-full or RUN-lora.
    Exit status: as slmlab train (0 done, 1 diverged, 2 an input error, 130/143 interrupted with a checkpoint).
    """
    p = command_parser(finetune_command, "finetune")
    p.add_argument("run", nargs="?", help="the run, checkpoint or saved model folder to fine-tune")
    p.add_argument("items", nargs="*", help="config.yaml files and key=value overrides (optim.lr=1e-4 ...)")
    p.add_argument("--data", help="chat data: a .jsonl file or builtin:chat (= data=...)")
    p.add_argument("--lora", nargs="?", const="", metavar="SPEC", help="train LoRA adapters: r=8,alpha=16,dropout=0,"
                   "targets=NAME,NAME (each optional)")
    p.add_argument("--merge", action="store_true", help="write OUT/merged (or, without --data, merge RUN's adapter"
                   " into --out)")
    add_run_arguments(p, "continue from the newest checkpoint of out_dir",
                      "on resume, accept a change of this protected field; repeatable")
    p.add_argument("--make-data", metavar="OUT.jsonl", help="write the builtin:chat set to this file and exit")
    p.add_argument("--eval-only", action="store_true", help="print RUN's held-out assistant-token loss on --data and"
                   " exit (a base model, a fine-tune or an adapter; nothing is trained)")
    args = p.parse_intermixed_args(argv)
    if args.make_data:
        from ..data.chat_data import builtin_chat, write_chat_jsonl

        rows = builtin_chat()
        print(f"slmlab finetune: wrote {len(rows):,} conversations to {write_chat_jsonl(rows, args.make_data)}")
        return 0
    if not args.run:
        p.error("the folder to fine-tune (RUN) is required, unless --make-data")
    if args.eval_only:
        if not args.data:
            p.error("--eval-only needs --data (a .jsonl chat file or builtin:chat)")
        from ..train.config import parse_overrides
        from ..train.finetune import evaluate_chat

        block = parse_overrides(split_items(args.items)[1]).get("block_size")
        result = evaluate_chat(args.run, args.data, block)
        print(f"slmlab finetune: {result['checkpoint']} on the held-out split of {args.data}: assistant-token loss"
              f" {result['loss']:.4f} nats/token, perplexity {result['ppl']:.2f}, accuracy {result['acc']:.4f}"
              f" ({result['tokens']:,} tokens)")
        return 0
    if not args.data:
        if not args.merge:
            p.error("--data is required (a .jsonl chat file or builtin:chat), or --merge to merge RUN's adapter")
        from ..train.finetune import write_merged

        out = args.out or f"{args.run.rstrip('/')}-merged"
        print(f"slmlab finetune: wrote the merged model to {write_merged(args.run, out)}")
        return 0
    from ..train.finetune import finetune_run

    files, overrides = split_items(args.items)
    overrides = [f"model={args.run}", f"data={args.data}"] + overrides + run_overrides(args)
    return finetune_run(args.run, files, overrides, args.lora, args.resume_from or args.resume, tuple(args.allow_change),
                        args.merge)
