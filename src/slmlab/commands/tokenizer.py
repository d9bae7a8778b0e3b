"""``slmlab tokenizer``: train a ByteLevel BPE, or apply a tokenizer (:mod:`slmlab.data`)."""

from __future__ import annotations

import json
from pathlib import Path

from ._common import command_parser


def tokenizer_command(argv: list[str]) -> int:
    """Train, inspect or apply a tokenizer.

      slmlab tokenizer train --data shakespeare --vocab-size 2048 --out tok/   (ByteLevel BPE)
      slmlab tokenizer encode tok/ "To be, or not to be"                       (prints ids)
      slmlab tokenizer decode tok/ 310 42 7                                    (prints text)
    A tokenizer is `byte`, `bpe`, a tokenizer.json or a saved tokenizer folder (a run checkpoint too).
    """
    p = command_parser(tokenizer_command, "tokenizer")
    sub = p.add_subparsers(dest="action", required=True)
    tr = sub.add_parser("train", help="train a ByteLevel BPE on a corpus and save it")
    tr.add_argument("--data", required=True, help="corpus spec (shakespeare, pystdlib, files)")
    tr.add_argument("--vocab-size", type=int, default=2048)
    tr.add_argument("--out", required=True)
    tr.add_argument("--errors", default="strict", choices=["strict", "replace"])
    enc = sub.add_parser("encode", help="text -> ids")
    enc.add_argument("tokenizer")
    enc.add_argument("text")
    dec = sub.add_parser("decode", help="ids -> text")
    dec.add_argument("tokenizer")
    dec.add_argument("ids", nargs="+", type=int)
    args = p.parse_args(argv)
    from ..data import get_source, get_tokenizer

    if args.action == "train":
        probe = get_source(args.data, get_tokenizer("byte"), 64, errors=args.errors)
        tok = get_tokenizer("bpe", texts=probe.train_texts(), vocab_size=args.vocab_size)  # streamed, never held
        tok.save_pretrained(args.out)
        print(json.dumps({"out": str(Path(args.out)), "vocab_size": len(tok), "bos": tok.bos_token,
                          "eos": tok.eos_token, "pad": tok.pad_token}))
        return 0
    tok = get_tokenizer(args.tokenizer)
    if args.action == "encode":
        print(" ".join(str(i) for i in tok(args.text, add_special_tokens=False)["input_ids"]))
    else:
        bad = [i for i in args.ids if not 0 <= i < len(tok)]
        if bad:
            raise ValueError(f"token ids {bad} are outside the vocabulary [0, {len(tok)})")
        print(tok.decode(args.ids))
    return 0
