"""Does data loading stall training? Tokens/s of a small model's training step fed by the real
loader (``DataSource.batches``: memory-mapped token stream, shuffled blocks) vs by pre-built tensors.

Both sides run in this process, interleaved round by round (A B, B A, ...) on the same model and
the same batches, so machine noise hits both alike. Reported: the median over round pairs of
(loader tokens/s) / (pre-built tokens/s), the ratio of the two medians, and the share of the loader
rounds' wall time spent inside ``next(stream)`` (the stall itself, immune to machine noise).
Target: loader / pre-built >= 0.95.

    .venv/bin/python benchmarks/bench_dataloader.py                      # pystdlib, byte tokenizer (offline)
    .venv/bin/python benchmarks/bench_dataloader.py --data shakespeare --tokenizer bpe
    .venv/bin/python benchmarks/bench_dataloader.py --data mqar:cpu --block-size 64
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch

from slmlab.data import get_source, get_tokenizer
from slmlab.models import get_family


def build(args):
    tok = None
    if args.data.split(":")[0] not in ("mqar", "t1", "t7", "distance_retrieval"):
        if args.tokenizer == "bpe":
            texts = get_source(args.data, None, args.block_size, cache_dir=args.cache).train_texts()
            tok = get_tokenizer("bpe", texts=texts, vocab_size=args.vocab_size, cache_dir=args.cache)
        else:
            tok = get_tokenizer(args.tokenizer, cache_dir=args.cache)
    source = get_source(args.data, tok, None if tok is None else args.block_size, cache_dir=args.cache)
    family = get_family("lumen")
    cfg = family.make_config(
        args.preset, vocab_size=source.min_vocab_size, max_seq_len=source.seq_len, **json.loads(args.model_config)
    )
    torch.manual_seed(0)
    model = family.model_class(cfg).to(args.device)
    return source, model


def run_round(model, opt, batches, device) -> tuple[int, float, float]:
    """Train on every batch the iterator yields; returns (tokens, seconds, seconds spent waiting for data)."""
    tokens, waiting = 0, 0.0
    batches = iter(batches)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    while True:
        t = time.perf_counter()
        batch = next(batches, None)
        waiting += time.perf_counter() - t
        if batch is None:
            break
        ids = batch["input_ids"].to(device, non_blocking=True)
        labels = batch["labels"].to(device, non_blocking=True)
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += ids.numel()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - start, waiting


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="pystdlib")
    p.add_argument("--tokenizer", default="byte", help="byte | bpe | path")
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20, help="training steps per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds per side, interleaved")
    p.add_argument("--preset", default="lumen-tiny")
    p.add_argument("--model-config", default="{}", help="JSON overrides of the Lumen config")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cache", default=None, help="data cache folder (default $SLMLAB_CACHE or ~/.cache/slmlab)")
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch CPU threads (1 by default: on a shared 2-core machine 2 threads spin against other jobs)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    t0 = time.perf_counter()
    source, model = build(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stream = source.batches("train", args.batch_size, seed=0)
    next(stream)  # tokenises (first run only) and maps the cache
    setup_s = time.perf_counter() - t0

    # Loader alone: how many batches per second it can produce with no model attached.
    t0 = time.perf_counter()
    n_alone = 200
    for _ in itertools.islice(source.batches("train", args.batch_size, seed=1), n_alone):
        pass
    loader_alone = n_alone * args.batch_size * source.seq_len / (time.perf_counter() - t0)

    # Pre-built tensors: the same stream materialised once (on the device, the ideal case).
    prebuilt = [
        {k: v.to(device) for k, v in b.items()}
        for b in itertools.islice(source.batches("train", args.batch_size, seed=2), args.steps)
    ]
    run_round(model, opt, prebuilt[:3], device)  # warm-up (allocator, autograd graph)

    loader_rates, prebuilt_rates, wait_share = [], [], []
    for r in range(args.rounds):
        # A B then B A: an order effect (cache, frequency, neighbours) hits both sides equally.
        for side in ("loader", "prebuilt") if r % 2 == 0 else ("prebuilt", "loader"):
            if side == "loader":
                live = itertools.islice(source.batches("train", args.batch_size, seed=2, step=0), args.steps)
                tokens, secs, waiting = run_round(model, opt, live, device)
                loader_rates.append(tokens / secs)
                wait_share.append(waiting / secs)
            else:
                tokens, secs, _ = run_round(model, opt, prebuilt, device)
                prebuilt_rates.append(tokens / secs)

    loader_tps, prebuilt_tps = statistics.median(loader_rates), statistics.median(prebuilt_rates)
    # Adjacent rounds share the machine's state: their ratio cancels most of the noise.
    pair_ratio = statistics.median(a / b for a, b in zip(loader_rates, prebuilt_rates))
    result = {
        "data": args.data,
        "tokenizer": args.tokenizer,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "model": args.preset,
        "params": sum(p.numel() for p in model.parameters()),
        "batch": [args.batch_size, source.seq_len],
        "setup_s": round(setup_s, 2),
        "loader_alone_tokens_per_s": round(loader_alone),
        "train_tokens_per_s_loader": round(loader_tps),
        "train_tokens_per_s_prebuilt": round(prebuilt_tps),
        "ratio": round(pair_ratio, 4),
        "ratio_of_medians": round(loader_tps / prebuilt_tps, 4),
        "loader_wait_share": round(statistics.median(wait_share), 5),
        "rounds_loader": [round(x) for x in loader_rates],
        "rounds_prebuilt": [round(x) for x in prebuilt_rates],
        "target": ">= 0.95",
    }
    print(f"{'side':<28}{'tokens/s':>14}")
    print(f"{'loader alone (no model)':<28}{result['loader_alone_tokens_per_s']:>14,}")
    print(f"{'train step, real loader':<28}{result['train_tokens_per_s_loader']:>14,}")
    print(f"{'train step, pre-built':<28}{result['train_tokens_per_s_prebuilt']:>14,}")
    print(f"ratio loader/pre-built = {result['ratio']:.3f} (median of adjacent-round ratios; target >= 0.95)")
    print(f"share of the loader round spent waiting for data = {result['loader_wait_share']:.2%}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
