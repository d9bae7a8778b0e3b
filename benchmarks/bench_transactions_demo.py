"""The demo's scoring cost: one customer's whole history scored by the streaming scorer (windows of
``T`` = 64 with stride 32, each scoring only its newest 32 transactions, as evaluation and the demo's
scoring tab do) against the naive way, every transaction scored from its own full window of the ``T``
transactions ending at it. Both give every transaction a score with at least 32 (streaming) or 63
(naive) earlier transactions of history; the scores are printed side by side as a check.

Prints backbone tokens and wall time of both and their ratios (targets: >= 15x fewer tokens, >= 10x
faster). The model is ``lfm2_tiny``'s backbone with a 64-transaction window and random weights (the
cost does not depend on the weights); the history is the longest of a small generated bank.

    .venv/bin/python benchmarks/bench_transactions_demo.py --threads 1 [--preset lfm2_tiny] [--days 90] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table, timeit_interleaved  # noqa: E402
from slmlab.transactions.data.bank import prepare_bank  # noqa: E402
from slmlab.transactions.data.synth import SynthConfig, generate  # noqa: E402
from slmlab.transactions.demo.state import stream_scores, window_scores  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel  # noqa: E402
from slmlab.transactions.model import preset_schema  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="lfm2_tiny")
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--days", type=int, default=90, help="days of history generated")
    ap.add_argument("--customers", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = generate(SynthConfig.from_preset("tiny", n_customers=args.customers, n_days=args.days, seed=7))
    bank = prepare_bank(data.transactions, preset_schema(args.preset), data.customers)
    enc = bank.encoded()
    cust = max(enc, key=lambda c: len(enc[c]))
    ids = enc[cust].astype(np.int64)
    config = TransactionFraudConfig.from_preset(args.preset, schema=bank.fitted, max_transactions=args.T)
    model = TransactionFraudModel(config).eval()
    n, F = ids.shape
    ends = np.arange(n)
    stream, tokens_stream = stream_scores(model, ids)
    naive = window_scores(model, ids, ends)
    tokens_naive = n * args.T * F
    # the two agree where the streaming window also ends at the transaction (its newest row)
    T = args.T
    last_rows = np.array([e - 1 for e in range(n, 0, -(T // 2))])
    gap = float(np.abs(stream[last_rows] - naive[last_rows]).max())
    with torch.no_grad():
        times = timeit_interleaved({"streaming": lambda: stream_scores(model, ids),
                                    "own window": lambda: window_scores(model, ids, ends)}, repeats=args.repeats,
                                   warmup=0)  # the calls above were the warm-up
    rows = [{"scorer": "streaming (T=64, stride 32)", "transactions": n, "backbone tokens": tokens_stream,
             "seconds": times["streaming"], "ms / transaction": 1e3 * times["streaming"] / n},
            {"scorer": "own full window each", "transactions": n, "backbone tokens": tokens_naive,
             "seconds": times["own window"], "ms / transaction": 1e3 * times["own window"] / n}]
    print_table(rows, f"Scoring customer {cust}'s whole history ({n} transactions), {args.preset} backbone, "
                      f"threads {torch.get_num_threads()}")
    print(f"\ntokens ratio {tokens_naive / tokens_stream:.1f}x (target >= 15x); "
          f"time ratio {times['own window'] / times['streaming']:.1f}x (target >= 10x)")
    print(f"max |score difference| where both windows end at the transaction: {gap:.2e}")


if __name__ == "__main__":
    main()
