"""How data preparation scales: time, peak memory and tokenising throughput at 100 MB, 1 GB, 4 GB.

For each size a corpus of jsonl files (64 MiB each, one document of 0.4-3 KB of Zipf-distributed
synthetic words per line, ~66k documents per 100 MB) is generated once, then two child processes run
on it one after the other, each measured alone (wall and CPU seconds of work after imports, CPU
summed over every thread, and the child's own peak RSS, from ``getrusage``; on a shared machine the
CPU seconds are the figure to read, wall time follows the neighbours' load):

- ``slmlab``: ``load_corpus`` (the index pass and split) + ``token_cache`` (fingerprint, sharded
  tokenisation, joining the shards) with a fixed ByteLevel BPE tokenizer (vocabulary 8,192, trained
  once on the first 16 MiB of the smallest corpus);
- ``tokenizers``: the anchor, the ``tokenizers`` library alone on the same text with the same
  cores: read every line, ``json.loads``, ``encode_batch`` in 4 MiB batches, count the tokens.

It prints a Markdown table (the one in docs/data.md): MB, documents, seconds, seconds per MB, peak
RSS, tokens per second of the whole preparation and of the anchor, and their ratio. Run it on a
quiet machine: ``python benchmarks/bench_data_scale.py --sizes 100,1000 --out /tmp/scale``.
``--sizes 1`` (1 MB) is the smoke test the suite runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FILE_BYTES = 64 << 20
VOCAB_WORDS = 50_000


def word_table(seed: int = 0) -> list[str]:
    """A synthetic vocabulary: VOCAB_WORDS random lowercase words of 2-10 letters."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, rng.integers(2, 11))) for _ in range(VOCAB_WORDS)]


def generate(folder: Path, megabytes: float, seed: int = 0) -> dict:
    """Write ``megabytes`` of jsonl text into ``folder`` (kept: a second call with the same size reuses it)."""
    done = folder / "done.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    words = np.array(word_table(seed), dtype=object)
    ranks = np.arange(1, VOCAB_WORDS + 1)
    cdf = np.cumsum(1.0 / ranks) / (1.0 / ranks).sum()  # Zipf's law, as natural text
    rng = np.random.default_rng(seed + 1)
    target, written, docs, part = int(megabytes * (1 << 20)), 0, 0, 0
    out = open(folder / f"part-{part:04d}.jsonl", "w", encoding="utf-8")
    while written < target:
        n_words = int(rng.integers(60, 450))  # 0.4-3 KB per document, ~660k documents per GB
        idx = np.minimum(np.searchsorted(cdf, rng.random(n_words)), VOCAB_WORDS - 1)
        body = " ".join(words[idx])
        line = json.dumps({"text": f"Document {docs}. " + body.replace(" ", "\n", n_words // 40)}) + "\n"
        out.write(line)
        written += len(line)
        docs += 1
        if out.tell() >= FILE_BYTES and written < target:
            out.close()
            part += 1
            out = open(folder / f"part-{part:04d}.jsonl", "w", encoding="utf-8")
    out.close()
    info = {"bytes": written, "documents": docs, "files": part + 1}
    done.write_text(json.dumps(info))
    return info


def child_slmlab(corpus: str, tokenizer: str, cache: str) -> dict:
    from slmlab.data import load_corpus
    from slmlab.data.packing import token_cache
    from slmlab.data.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    cpu0 = _cpu()
    t0 = time.perf_counter()
    c = load_corpus(corpus)
    t_index = time.perf_counter() - t0
    c.fingerprint()
    t_fingerprint = time.perf_counter() - t0 - t_index
    streams = token_cache(c, tok, Path(cache), progress=False)
    return {"index_s": t_index, "fingerprint_s": t_fingerprint, "work_s": time.perf_counter() - t0,
            "tokens": int(sum(len(s.tokens) for s in streams.values())), "cpu0": cpu0}


def child_tokenizers(corpus: str, tokenizer: str) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    cpu0 = _cpu()
    t0 = time.perf_counter()
    tokens, batch, size = 0, [], 0
    for path in sorted(Path(corpus).glob("*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                batch.append(json.loads(line)["text"])
                size += len(batch[-1])
                if size >= 1 << 22:
                    tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
                    batch, size = [], 0
    if batch:
        tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
    return {"tokens": tokens, "work_s": time.perf_counter() - t0, "cpu0": cpu0}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(args: list[str]) -> dict:
    """Run this script as a child with ``args``: its wall seconds and printed JSON (with its own peak RSS)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "seconds": time.perf_counter() - t0}


def run(sizes: list[float], out: Path) -> list[dict]:
    from slmlab.data.tokenizers import train_bpe

    rows = []
    tok_dir = out / "tokenizer"
    for mb in sizes:
        folder = out / f"corpus-{mb:g}MB"
        info = generate(folder, mb)
        if not (tok_dir / "tokenizer.json").is_file():
            first = sorted(folder.glob("*.jsonl"))[0]
            texts, size = [], 0
            with open(first) as f:
                for line in f:
                    texts.append(json.loads(line)["text"])
                    size += len(texts[-1])
                    if size > 16 << 20:
                        break
            train_bpe(texts, 8192).save_pretrained(str(tok_dir))
        cache = out / f"cache-{mb:g}"
        subprocess.run(["rm", "-rf", str(cache)], check=True)
        ours = measure(["--child", "slmlab", str(folder), str(tok_dir), str(cache)])
        anchor = measure(["--child", "tokenizers", str(folder), str(tok_dir)])
        mbytes = info["bytes"] / (1 << 20)
        ours_rate, anchor_rate = ours["tokens"] / ours["work_s"], anchor["tokens"] / anchor["work_s"]
        ours_cpu, anchor_cpu = ours["tokens"] / ours["cpu_s"], anchor["tokens"] / anchor["cpu_s"]
        rows.append({"MB": round(mbytes, 1), "documents": info["documents"], "seconds": round(ours["work_s"], 1),
                     "s_per_MB": round(ours["work_s"] / mbytes, 4), "cpu_s": round(ours["cpu_s"], 1),
                     "cpu_s_per_MB": round(ours["cpu_s"] / mbytes, 4), "peak_rss_MB": round(ours["peak_rss_mb"]),
                     "index_s": round(ours["index_s"], 1), "fingerprint_s": round(ours["fingerprint_s"], 1),
                     "tokens": ours["tokens"], "tok_per_s": round(ours_rate), "tok_per_cpu_s": round(ours_cpu),
                     "anchor_seconds": round(anchor["work_s"], 1), "anchor_cpu_s": round(anchor["cpu_s"], 1),
                     "anchor_peak_rss_MB": round(anchor["peak_rss_mb"]), "anchor_tok_per_s": round(anchor_rate),
                     "anchor_tok_per_cpu_s": round(anchor_cpu), "ratio": round(ours_rate / anchor_rate, 3),
                     "cpu_ratio": round(ours_cpu / anchor_cpu, 3), "load": round(os.getloadavg()[0], 2),
                     # every document framed <bos> ... <eos>: the same text was tokenised, once
                     "same_tokens": ours["tokens"] == anchor["tokens"] + 2 * info["documents"]})
        print(json.dumps(rows[-1]), flush=True)
        subprocess.run(["rm", "-rf", str(cache)], check=True)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| text | documents | wall s | CPU s | CPU s per MB | peak RSS | tokens | slmlab tok per CPU s |"
            " tokenizers alone tok per CPU s | ratio (CPU) | ratio (wall) |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['MB']:,.0f} MB | {r['documents']:,} | {r['seconds']:,.1f} | {r['cpu_s']:,.1f} |"
                     f" {r['cpu_s_per_MB']:.3f} | {r['peak_rss_MB']:,} MB | {r['tokens']:,} | {r['tok_per_cpu_s']:,} |"
                     f" {r['anchor_tok_per_cpu_s']:,} | {r['cpu_ratio']:.2f} | {r['ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100,1000", help="corpus sizes in MB, comma-separated")
    p.add_argument("--out", default="/tmp/slmlab-data-scale", help="where corpora and caches go (kept)")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        result = child_slmlab(*rest) if kind == "slmlab" else child_tokenizers(*rest)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        result["peak_rss_mb"] = usage.ru_maxrss / 1024  # KiB on Linux
        result["cpu_s"] = usage.ru_utime + usage.ru_stime - result.pop("cpu0")  # every thread, after imports
        print(json.dumps(result))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [float(s) for s in args.sizes.split(",")]
    print(f"# data preparation at {', '.join(f'{s:g} MB' for s in sizes)}; cpus {os.cpu_count()},"
          f" load {os.getloadavg()[0]:.2f}", flush=True)
    rows = run(sizes, out)
    print(table(rows))
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
